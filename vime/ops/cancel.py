"""`vime cancel RUN`: stop a run for good: its training workflow and the rollouts it has in flight.

The training workflow cancels its rollout workflows and waits for their cleanup (an agent rollout
tears its sandbox down, `vime/envs/coding_agent/workflow.py`), frees its trainer, then ends as cancelled;
a `vime train` following it sees that and exits. Nothing stored is removed: the samples and
checkpoints stay for `vime samples`, `vime report` and `vime rescore`, and the line says what
starting the run again would do (`vime.ops.restart`).
"""

from __future__ import annotations

import asyncio
import time

from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from vime.errors import ConfigError, VimeError
from vime.ops.commands import run_parser
from vime.ops.locate import run_dir_of, store_for, temporal_for
from vime.temporal.restart_plan import recorded, restart_plan
from vime.rundir import read_launch_info
from vime.temporal.client import connect

WAIT_S = 120.0


async def cancel_run(address: str, namespace: str, run_id: str, wait_s: float = WAIT_S, store: str = "") -> str:
    """Request the cancel and wait (at most `wait_s`) for the workflow to close; one line saying how it
    ended and what a start of it again does (from its store at `store`)."""
    client = await connect(address, namespace)
    handle = client.get_workflow_handle(f"train-{run_id}")
    try:
        described = await handle.describe()
    except RPCError as e:
        if e.status == RPCStatusCode.NOT_FOUND:
            raise ConfigError(f"run {run_id!r} has no training workflow (train-{run_id}) in the Temporal at {address}; "
                              "`vime runs` lists the runs of a store") from None
        raise
    if described.status != WorkflowExecutionStatus.RUNNING:
        return f"run {run_id}: its workflow already ended ({described.status.name.lower()}); nothing to cancel"
    await handle.cancel()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        described = await handle.describe()
        if described.status != WorkflowExecutionStatus.RUNNING:
            return (f"run {run_id}: {described.status.name.lower()} (train-{run_id} and the rollouts it had in "
                    f"flight, each after its cleanup); its samples stay in the store; "
                    f"{restart_plan(await asyncio.to_thread(recorded, store, run_id))}")
        await asyncio.sleep(1.0)
    return (f"run {run_id}: cancel requested, still cleaning up after {wait_s:.0f} s (its rollouts tear their "
            f"sandboxes down); `vime status {run_id}` shows when it has ended")


def cancel_main(argv: list[str]) -> int:
    parser = run_parser("vime cancel", "Cancel a run: its training workflow and the rollouts in flight (sandboxes "
                        "torn down). Its stored samples and checkpoints stay.")
    parser.add_argument("--temporal-address", help="the Temporal the run lives in (default: its running launch's)")
    parser.add_argument("--temporal-namespace", default="default")
    parser.add_argument("--wait", type=float, default=WAIT_S, help="seconds to wait for the cleanup (default 120)")
    args = parser.parse_args(argv)
    launch = read_launch_info(run_dir_of(args.run, args.run_dir)) or {}
    address = temporal_for(args, launch)
    if not address:
        raise ConfigError(f"run {args.run!r}: no running launch of it (no launch.json in its run directory); pass "
                          "--temporal-address HOST:PORT of the Temporal it lives in")
    try:
        print(asyncio.run(cancel_run(address, launch.get("namespace", args.temporal_namespace), args.run, args.wait,
                                     store_for(args))))
    except RPCError as e:
        raise VimeError(f"vime cancel: Temporal at {address}: {e.message}") from None
    return 0
