"""Heartbeat an activity in the background while its real work runs (in a thread, or awaiting).

A heartbeat is what lets Temporal notice a dead worker (kill -9) within the heartbeat timeout
instead of the start-to-close timeout, and it is how a cancellation reaches the activity.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from temporalio import activity

P = ParamSpec("P")
T = TypeVar("T")


@contextlib.asynccontextmanager
async def heartbeating(interval: float | None = None, *details: Any) -> AsyncIterator[None]:
    """Send a heartbeat every `interval` s (default: a third of the heartbeat timeout, max 5 s)."""
    if not activity.in_activity() or activity.info().is_local:  # a local activity cannot heartbeat
        yield
        return
    timeout = activity.info().heartbeat_timeout
    if interval is None:
        interval = min(5.0, timeout.total_seconds() / 3) if timeout else 5.0

    async def beat() -> None:
        while True:
            activity.heartbeat(*details)
            await asyncio.sleep(interval)

    task = asyncio.create_task(beat())
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def heartbeats_throughout(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Decorate an async activity so that it heartbeats from its first line to its last: the
    reads before its work and the store write after it too. A rollout activity's heartbeat
    timeout is seconds (`vime.temporal.activity_bounds`), so a store call waiting for SQLite's
    lock, or a first read of the run's config, must not go quiet that long."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        async with heartbeating():
            return await fn(*args, **kwargs)

    return wrapper
