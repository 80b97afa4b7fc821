"""Synchronous `SampleStore` calls from async activities, run off the worker's event loop.

A worker's event loop runs its workflow tasks, the heartbeats of its activities and every async
activity. A store call is synchronous, and on SQLite a write waits for the database's write
lock (seconds to minutes: the busy timeout, then the store's own retries) while another process
holds it. Made on the loop, that wait freezes every heartbeat and workflow of the worker, long
enough for the server to time out healthy activities. `await store_call(fn, *args)` runs the
call in a thread instead.

The threads are a small pool of their own, not the loop's default executor: calls waiting for a
lock must not take the threads that sandbox file copies and teardowns run on (SQLite serializes
writers anyway, so more threads would only wait in more places).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")

MAX_THREADS = 8

_pool: ThreadPoolExecutor | None = None


async def store_call(fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)` in a store thread (with this task's context vars, so log fields carry
    over). Cancelling the await does not stop a call already running: a write may still commit,
    which the store's idempotent writes (first write wins) make harmless."""
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(MAX_THREADS, thread_name_prefix="vime-store")
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await asyncio.get_running_loop().run_in_executor(_pool, call)
