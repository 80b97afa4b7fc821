"""Calling a user's reward or generate hook with a time limit, and knowing which calls are slow.

A hook that hangs must cost one sample, not the run: `call_limited` gives every call
`--custom-rm-timeout` / `--custom-generate-timeout` seconds and raises `HookTimeout` past them
(the caller records the sample FAILED). A sync hook runs in a thread of its own, so a hang
(`time.sleep(10**6)`, a blocking socket) cannot block the worker's event loop, where the other
samples, heartbeats and workflow tasks run, and the timeout can fire; a hung thread is left
behind as a daemon (Python cannot kill a thread), and dies with the worker. So a sync hook is
called from threads, concurrently: it must be thread-safe (or be written `async`).

Every call in flight is registered (`in_flight`) so that the worker can tell the console which
hook a step is waiting on (`slow_calls`, sent by `activities.hook_notices`): a silent two-hour
wait is what this replaces.
"""

from __future__ import annotations

import asyncio
import contextvars
import inspect
import itertools
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vime.plugins import call_hook

NOTICE_AFTER_S = 60.0
"""A call waiting this long (or half its time limit, if that is shorter) is worth a console line."""


class HookTimeout(Exception):
    """A hook call that ran past its time limit. Not a `TimeoutError`: that would read as an
    infrastructure failure (`is_infra_error`) and retry the group forever."""


@dataclass
class HookCall:
    """One call in flight: which run, which hook (its flag and path), since when."""

    run_id: str | None
    hook: str  # e.g. "--custom-rm-path rm.score"
    started: float  # time.monotonic()
    notice_after: float


in_flight: dict[int, HookCall] = {}
_ids = itertools.count()


def hook_label(flag: str, path: str) -> str:
    """How a hook is named in timeouts and console lines: `--custom-rm-path rm.score`."""
    return f"{flag} {path}"


def notice_after(timeout: float) -> float:
    return min(NOTICE_AFTER_S, timeout / 2) if timeout > 0 else NOTICE_AFTER_S


async def call_limited(fn: Callable[..., Any], label: str, timeout: float, *args: Any,
                       run_id: str | None = None, **optional: Any) -> Any:
    """`call_hook(fn, *args, **optional)`, awaited, within `timeout` seconds (0: no limit).

    Raises `HookTimeout("<label> timed out after N s")`; what the hook raises propagates as is
    (a `TimeoutError` of the hook's own, e.g. its HTTP client's, stays one).
    """
    key = next(_ids)
    in_flight[key] = HookCall(run_id, label, time.monotonic(), notice_after(timeout))
    try:
        if timeout <= 0:
            return await _call(fn, args, optional)
        limit = asyncio.timeout(timeout)
        try:
            async with limit:
                return await _call(fn, args, optional)
        except TimeoutError:
            if not limit.expired():
                raise
            raise HookTimeout(f"{label} timed out after {timeout:g} s") from None
    finally:
        del in_flight[key]


async def _call(fn: Callable[..., Any], args: tuple, optional: dict) -> Any:
    if _is_async(fn):
        result = call_hook(fn, *args, **optional)
    else:
        result = await _in_thread(lambda: call_hook(fn, *args, **optional))
    if inspect.isawaitable(result):  # a sync function that returned a coroutine
        result = await result
    return result


def _is_async(fn: Callable[..., Any]) -> bool:
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


def _in_thread(work: Callable[[], Any]) -> asyncio.Future:
    """Run `work` in a new daemon thread; the future ends when it does. Not the loop's default
    executor: a hung call would hold one of its few threads for good, and its threads are
    joined at exit, so a hang would also hold the worker's exit."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():  # timed out or cancelled meanwhile
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def run() -> None:
        try:
            result, error = context.run(work), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    threading.Thread(target=run, name="vime-hook", daemon=True).start()
    return done


def user_frame(exc: BaseException, fn: Callable[..., Any] | None = None) -> str:
    """` (file.py:12)`: where the hook raised. The innermost frame in the hook's own file (a
    hook that calls a library raises inside the library; its own line is the useful one), else
    the innermost frame of the traceback."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if fn is not None else None
    own = code.co_filename if code is not None else None
    tb, found, last = exc.__traceback__, None, None
    while tb is not None:
        last = tb
        if tb.tb_frame.f_code.co_filename == own:
            found = tb
        tb = tb.tb_next
    where = found or last
    return f" ({where.tb_frame.f_code.co_filename}:{where.tb_lineno})" if where is not None else ""


def slow_calls(now: float | None = None) -> dict[tuple[str | None, str], tuple[int, float]]:
    """Calls in flight past their notice time, per (run, hook): how many, and the oldest's age."""
    now = time.monotonic() if now is None else now
    slow: dict[tuple[str | None, str], tuple[int, float]] = {}
    for call in list(in_flight.values()):
        age = now - call.started
        if age >= call.notice_after:
            count, oldest = slow.get((call.run_id, call.hook), (0, 0.0))
            slow[(call.run_id, call.hook)] = (count + 1, max(oldest, age))
    return slow


def waiting_line(hook: str, count: int, age: float) -> str:
    """`[vime] waiting on --custom-rm-path rm.score for 60 s: 3 samples`."""
    return f"[vime] waiting on {hook} for {age:.0f} s: {count} sample{'s' if count != 1 else ''}"
