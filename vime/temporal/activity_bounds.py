"""How soon Temporal calls a rollout activity's attempt lost: sized to the activity, not to a minute.

Under a burst the SQLite-backed dev server can record an activity's start while the poll that
carried it to the worker is lost: no worker runs it, and only a timer finds it (issue #25: tool_use
steps of 65-85 s instead of 8-15 s, each waiting out a 60 s heartbeat timeout). A rollout activity
heartbeats from a background task (`vime.temporal.heartbeat.heartbeating`: every
min(5 s, timeout / 3); the SDK sends one at once, then at most every 0.8 x timeout), so its
heartbeat timeout can be seconds: a lost start, or a dead worker, is then found in
`ROLLOUT_HEARTBEAT_SECONDS` and retried a second later (`rollout_retry_policy`).

Retrying early is safe because rollout activities are idempotent: the store writes once per
rollout id, a multi-turn rollout resumes from its stored turns, and a group that is already
stored is returned as stored. The trainer's activities keep `--heartbeat-timeout` whole (a train
step holds the CPU, and its queue's lost-trainer path is not a cheap retry), and so do a user's
whole-step hooks and `vime eval`'s checkpoint load.

Light on purpose (temporalio's common module, vime.temporal.retry): workflows import it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from vime.temporal.retry import rollout_retry_policy

ROLLOUT_HEARTBEAT_SECONDS = 6.0
"""The most a rollout activity's heartbeat timeout is. A lost start costs this, the server's timer
(measured: up to ~1 s late) and the 1 s retry interval: ~8 s, under the 10 s that
`bench/activity_burst.py` counts as a stall (8 s cost ~10 s). The SDK sends a heartbeat every
0.8 x this, so one has 1.2 s to reach a loaded server: 256 activities of 20 s each on the
SQLite dev server saw no false timeout (docs/performance.md)."""


def rollout_heartbeat_seconds(configured: float) -> float:
    """The heartbeat timeout of rollout activities for a `--heartbeat-timeout` of `configured`:
    the shorter of the two."""
    return min(configured, ROLLOUT_HEARTBEAT_SECONDS)


def rollout_activity_options(heartbeat_seconds: float, timeout: timedelta = timedelta(hours=2), *,
                             capped: bool = True) -> dict[str, Any]:
    """`execute_activity`'s bounds for a heartbeating rollout activity: `timeout` in all, the
    rollout retry policy, and a heartbeat every `rollout_heartbeat_seconds(heartbeat_seconds)` at
    most. Not `capped`: `heartbeat_seconds` itself, for a `--rollout-function-path` or
    `--eval-function-path` hook's whole step (one activity, never a burst, whose async code may
    hold the event loop)."""
    seconds = rollout_heartbeat_seconds(heartbeat_seconds) if capped else heartbeat_seconds
    return {"start_to_close_timeout": timeout, "heartbeat_timeout": timedelta(seconds=seconds),
            "retry_policy": rollout_retry_policy()}
