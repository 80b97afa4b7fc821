"""Bursts of activity starts on the file-backed dev server: is a lost start found in seconds?

    python bench/activity_burst.py [--bursts 64 256] [--fan-out 1] [--work 0.5] [--heartbeat S] [--stall 10]

Under a burst the SQLite-backed dev server can record an activity's start while the poll that
carried it to the worker is lost ("context deadline exceeded"): nothing runs the activity, and
only a timer finds it, the heartbeat timeout (60 s before #25) or the start-to-close timeout.
This starts N activities at once, each in a workflow of its own (`--fan-out K`: K per workflow,
as a tool_use group has one per sample), each heartbeating for `--work` seconds: the shape of a
rollout, `execute_activity` with the bounds the environments use
(`vime.temporal.activity_bounds`). The server is `temporal server start-dev --db-filename` with
vime's pragmas (`TemporalDevServer`), one worker has the rollout worker's slots; the workflows
run unsandboxed (the sandbox costs worker CPU, not dispatch).

Per burst it prints the wall time, the slowest activity's schedule→start and schedule→complete
(from the first attempt's schedule: a lost start shows there), the slowest return→workflow lag,
the activities that needed a second attempt, and those that took `--stall` s or more beyond
their work. Any such stall, or any failed workflow, fails the bench (exit 1). A lost start does
not come when called: `--lose K` acts one out in K workflows (the first attempt is started and
never heartbeats, exactly what the server sees of a start whose poll was lost), to measure how
long the bound takes to find it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import os
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio import activity, workflow  # noqa: E402
from temporalio.client import Client  # noqa: E402
from temporalio.worker import UnsandboxedWorkflowRunner, Worker  # noqa: E402

from vime.temporal.activity_bounds import ROLLOUT_HEARTBEAT_SECONDS, rollout_activity_options  # noqa: E402
from vime.temporal.client import connect  # noqa: E402
from vime.temporal.dev_server import TemporalDevServer  # noqa: E402
from vime.temporal.heartbeat import heartbeating  # noqa: E402
from workers.rollout import ROLLOUT_ACTIVITY_SLOTS, ROLLOUT_WORKFLOW_TASK_SLOTS  # noqa: E402

ACTIVITY = "burst_activity"


@dataclass
class BurstInput:
    work_seconds: float
    heartbeat_seconds: float | None  # None: vime's bound for the default --heartbeat-timeout
    fan_out: int = 1  # activities per workflow, started together (a tool_use group: one per sample)
    lose: int = 0  # the first attempts of the first `lose` workflows' activities act out a lost start


@dataclass
class Timing:
    """One activity's times, as the server gave them to its last attempt."""

    scheduled: datetime  # the first attempt's schedule
    started: datetime  # the last attempt's start
    attempt: int
    finished: datetime  # the activity's own clock as it returned
    completed: datetime | None = None  # the workflow's clock when the result came back


@activity.defn(name=ACTIVITY)
async def burst_activity(inp: BurstInput) -> Timing:
    info = activity.info()
    if info.attempt == 1 and int(info.workflow_id.rsplit("-", 1)[1]) < inp.lose:
        with contextlib.suppress(asyncio.CancelledError):  # the worker's shutdown ends it
            await asyncio.sleep(3600)  # started, and never heard of again: what the server sees of a lost start
        return Timing(info.scheduled_time, info.started_time, info.attempt, datetime.now(timezone.utc))
    async with heartbeating():
        await asyncio.sleep(inp.work_seconds)
    return Timing(info.scheduled_time, info.started_time, info.attempt, datetime.now(timezone.utc))


@workflow.defn(name="BurstWorkflow")
class BurstWorkflow:
    @workflow.run
    async def run(self, inp: BurstInput) -> list[Timing]:
        async def one() -> Timing:
            bounds = rollout_activity_options(inp.heartbeat_seconds or ROLLOUT_HEARTBEAT_SECONDS, capped=False)
            timing = await workflow.execute_activity(ACTIVITY, inp, result_type=Timing, **bounds)
            timing.completed = workflow.now()
            return timing

        return list(await asyncio.gather(*(one() for _ in range(inp.fan_out))))


@dataclass
class BurstResult:
    size: int
    wall: float
    schedule_to_start: float  # the slowest, seconds
    schedule_to_complete: float  # the slowest, seconds
    result_lag: float  # the slowest activity return → its workflow seeing the result, seconds
    retried: int  # activities that needed more than one attempt
    stalled: int  # activities that took `--stall` s or more from schedule to completion
    failed: int
    first_error: str | None

    def line(self) -> str:
        return (f"burst {self.size:4d}: wall {self.wall:6.2f} s, slowest schedule→start "
                f"{self.schedule_to_start:6.2f} s, schedule→complete {self.schedule_to_complete:6.2f} s "
                f"(return→workflow {self.result_lag:5.2f} s), "
                f"retried {self.retried}, stalled {self.stalled}, failed {self.failed}")


async def burst(client: Client, queue: str, size: int, inp: BurstInput, stall: float) -> BurstResult:
    tag = uuid.uuid4().hex[:8]
    began = time.monotonic()
    handles = await asyncio.gather(*(client.start_workflow(BurstWorkflow.run, inp, id=f"burst-{tag}-{i}",
                                                           task_queue=queue) for i in range(size // inp.fan_out)))
    results = await asyncio.gather(*(h.result() for h in handles), return_exceptions=True)
    wall = time.monotonic() - began
    timings = [t for r in results if isinstance(r, list) for t in r]
    errors = [r for r in results if not isinstance(r, list)]
    to_start = [(t.started - t.scheduled).total_seconds() for t in timings]
    to_complete = [(t.completed - t.scheduled).total_seconds() for t in timings if t.completed]
    lag = [(t.completed - t.finished).total_seconds() for t in timings if t.completed]
    return BurstResult(size, wall, max(to_start, default=0.0), max(to_complete, default=0.0), max(lag, default=0.0),
                       sum(t.attempt > 1 for t in timings), sum(s - inp.work_seconds >= stall for s in to_complete),
                       len(errors),
                       repr(errors[0]) if errors else None)


async def run(args: argparse.Namespace, work: Path) -> list[BurstResult]:
    server = TemporalDevServer(work / "temporal", headless=True).start()
    try:
        client = await connect(server.address, timeout=30)
        queue = f"burst-{uuid.uuid4().hex[:8]}"
        inp = BurstInput(args.work, args.heartbeat, args.fan_out, args.lose)
        async with Worker(client, task_queue=queue, workflows=[BurstWorkflow], activities=[burst_activity],
                          workflow_runner=UnsandboxedWorkflowRunner(),
                          max_concurrent_activities=ROLLOUT_ACTIVITY_SLOTS,
                          max_concurrent_workflow_tasks=ROLLOUT_WORKFLOW_TASK_SLOTS):
            results = []
            for size in args.bursts:
                results.append(result := await burst(client, queue, size, inp, args.stall))
                print(result.line(), flush=True)
            return results
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bursts", type=int, nargs="+", default=[64, 256], help="workflows started at once, per burst")
    parser.add_argument("--work", type=float, default=0.5, help="seconds each activity works (heartbeating)")
    parser.add_argument("--heartbeat", type=float,
                        help="the activities' heartbeat timeout, seconds (default: vime's rollout bound, "
                             f"{ROLLOUT_HEARTBEAT_SECONDS:g} s; 60 was the bound before #25)")
    parser.add_argument("--fan-out", type=int, default=1,
                        help="activities per workflow (8: a tool_use group; the SDK starts only the first few of "
                             "a workflow task's activities eagerly, the rest go through the server's matching)")
    parser.add_argument("--lose", type=int, default=0,
                        help="act out a lost start in the first attempts of this many workflows' activities "
                             "(they never heartbeat): how long until the retry runs")
    parser.add_argument("--stall", type=float, default=10.0,
                        help="schedule→complete this long past the work counts as a stall")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="vime-burst-") as tmp:
        results = asyncio.run(run(args, Path(tmp)))
    bad = [r for r in results if r.stalled or r.failed]
    for r in bad:
        print(f"activity_burst: FAILED burst {r.size}: {r.stalled} stalled (>= {args.stall:g} s), {r.failed} failed"
              + (f"; first error {r.first_error}" if r.first_error else ""), file=sys.stderr)
    heartbeat = ROLLOUT_HEARTBEAT_SECONDS if args.heartbeat is None else args.heartbeat
    print(f"heartbeat timeout {heartbeat:g} s, work {args.work:g} s, fan-out {args.fan_out}: "
          + ("STALLED" if bad else "no stall"), flush=True)
    gc.collect()  # a client held by a cycle can abort the interpreter's exit (notes/temporal.md)
    sys.stdout.flush()
    os._exit(1 if bad else 0)


if __name__ == "__main__":
    main()
