"""Waiting for a vLLM server (or a router) to answer `/health`, from async code."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp


async def wait_until_healthy(url: str, timeout: float, *, every: float = 1.0,
                             while_waiting: Callable[[], None] | None = None) -> bool:
    """Poll `url/health` until it answers 200 (True) or `timeout` seconds pass (False);
    `while_waiting()` runs between polls (an activity's heartbeat, say)."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3)) as http:
        while True:
            try:
                async with http.get(url.rstrip("/") + "/health") as resp:
                    if resp.status == 200:
                        return True
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            if time.monotonic() >= deadline:
                return False
            if while_waiting is not None:
                while_waiting()
            await asyncio.sleep(every)
