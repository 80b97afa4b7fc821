"""Heartbeat an activity in the background while its real work runs (in a thread, or awaiting).

A heartbeat is what lets Temporal notice a dead worker (kill -9) within the heartbeat timeout
instead of the start-to-close timeout, and it is how a cancellation reaches the activity.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from temporalio import activity


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
