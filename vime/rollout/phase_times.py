"""Where a rollout's seconds go: cheap, always-on timers that `bench/step_profile.py` reads.

A rollout activity opens `collecting()`; code under it adds the seconds of named phases with
`timed(name)`. The samples of a group share one accumulator (a context variable holding a dict,
which the tasks `asyncio.gather` starts see), so a per-sample phase sums over the group's samples.
Outside `collecting()`, `timed` costs one context-variable read: no profile, no cost.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextvars import ContextVar

_TIMES: ContextVar[dict[str, float] | None] = ContextVar("vime_phase_times", default=None)


@contextlib.contextmanager
def collecting() -> Iterator[dict[str, float]]:
    """A fresh accumulator for the code under it: phase name → seconds."""
    times: dict[str, float] = {}
    token = _TIMES.set(times)
    try:
        yield times
    finally:
        _TIMES.reset(token)


@contextlib.contextmanager
def timed(name: str) -> Iterator[None]:
    """Add the seconds of the block to phase `name` of the accumulator in force, if any."""
    times = _TIMES.get()
    if times is None:
        yield
        return
    t0 = time.perf_counter()
    try:
        yield
    finally:
        times[name] = times.get(name, 0.0) + time.perf_counter() - t0
