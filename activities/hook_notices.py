"""Tell the console which hook a run is waiting on: "[vime] waiting on --custom-rm-path rm.score
for 60 s: 3 samples".

A hung hook used to be silent for the rollout activity's two hours. Rollout groups run as local
activities, which cannot heartbeat, and the worker's log is not the console; the launcher does
query the training workflow's `progress` every second. So one watcher per worker process looks
at the hook calls in flight (`vime.rollout.hook_calls.slow_calls`) every second and sends each
run's training workflow (`train-<run>`) a `notice` signal per slow hook, at most once a minute
per hook; `vime train` prints the notices from `progress`. A few signals in the workflow's
history, only while something is slow.
"""

from __future__ import annotations

import asyncio
import time

from temporalio.client import Client

from vime.log import get_logger
from vime.rollout.hook_calls import slow_calls, waiting_line
from vime.temporal.training_contract import NOTICE_SIGNAL

log = get_logger(__name__)

WATCH_EVERY_S = 1.0
REPEAT_AFTER_S = 60.0

_watchers: dict[int, asyncio.Task] = {}  # one per event loop


def watch_hooks(client: Client) -> None:
    """Start this process's watcher on the running loop (once)."""
    loop = asyncio.get_running_loop()
    task = _watchers.get(id(loop))
    if task is None or task.done():
        _watchers[id(loop)] = loop.create_task(_watch(client), name="vime-hook-notices")


async def _watch(client: Client) -> None:
    last: dict[tuple[str | None, str], float] = {}
    while True:
        await asyncio.sleep(WATCH_EVERY_S)
        now = time.monotonic()
        for (run_id, hook), (count, age) in slow_calls(now).items():
            if now - last.get((run_id, hook), -REPEAT_AFTER_S) < REPEAT_AFTER_S:
                continue
            last[(run_id, hook)] = now
            line = waiting_line(hook, count, age)
            log.warning("hook.waiting", run=run_id, hook=hook, samples=count, seconds=round(age))
            if run_id is not None:
                await _send(client, run_id, line)


async def _send(client: Client, run_id: str, line: str) -> None:
    try:
        await client.get_workflow_handle(f"train-{run_id}").signal(NOTICE_SIGNAL, line)
    except Exception as e:  # noqa: BLE001 - a notice is best effort (no training workflow: eval, a bench)
        log.info("hook.notice_not_sent", run=run_id, error=str(e)[:200])
