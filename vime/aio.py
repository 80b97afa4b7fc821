"""Threads the event loop waits out: `to_thread_to_end`.

`asyncio.to_thread` returns as soon as its caller is cancelled (an activity whose heartbeat timed
out, a workflow that gave up on a call), and the thread runs on. Whatever the thread works on
(the trainer's weights, the weight sync's delta tracker, a staged weights file) is then in use
twice: by that thread and by the next caller, which the cancel let in. Drilled: a cancelled sync's
work finishing after the newer sync left the servers' restart weights a version behind. Where the
next caller must find the state as the thread leaves it, `to_thread_to_end` lets the cancel take
effect only once the thread has ended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


async def to_thread_to_end(fn: Callable[..., T], /, *args, **kwargs) -> T:
    """`asyncio.to_thread(fn, *args, **kwargs)`, except that a cancel (however often repeated)
    waits for the thread to end before `CancelledError` is raised; the thread's own result or
    error is then dropped."""
    work = asyncio.ensure_future(asyncio.to_thread(fn, *args, **kwargs))
    try:
        return await asyncio.shield(work)
    except asyncio.CancelledError:
        while not work.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({work})
        if not work.cancelled():
            work.exception()  # retrieved, so asyncio does not log it as never awaited
        raise
