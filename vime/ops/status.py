"""`vime status RUN`: where a run stands. Live from its training workflow's `progress` query while
a launch of it runs (the launch's Temporal, from `<run-dir>/launch.json`) or at `--temporal-address`;
from the store once it has ended or stopped (with the command that resumes it)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from temporalio.service import RPCError

from vime.errors import VimeError
from vime.ops.commands import run_parser
from vime.ops.locate import open_existing, run_dir_of, store_for
from vime.ops.queries import run_summaries
from vime.rundir import read_launch_info
from vime.temporal.client import connect
from vime.temporal.training_contract import PROGRESS_QUERY

QUERY_TIMEOUT_S = 10


async def live_progress(address: str, namespace: str, run_id: str) -> dict:
    client = await connect(address, namespace)
    handle = client.get_workflow_handle(f"train-{run_id}")
    described = await handle.describe()
    if described.status.name != "RUNNING":  # its memo's notice: why it ended so (a finished run started again)
        notice = (await described.memo()).get("notice")
        return {"workflow": described.status.name.lower(), **({"notice": notice} if notice else {})}
    try:  # answered by a worker of the run: none when no launch (or worker pool) is up
        progress = await handle.query(PROGRESS_QUERY, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
    except RPCError as e:
        return {"workflow": "running", "live_error": f"no worker answered its query ({e.message})"}
    return {"workflow": "running", **progress}


def status_main(argv: list[str]) -> int:
    parser = run_parser("vime status", "Where a run stands: live from its workflow while it runs, else from its "
                        "store.")
    parser.add_argument("--temporal-address", help="the Temporal the run lives in (default: its running launch's)")
    parser.add_argument("--temporal-namespace", default="default")
    args = parser.parse_args(argv)
    run_dir = run_dir_of(args.run, args.run_dir)
    launch = read_launch_info(run_dir)
    address = args.temporal_address or (launch or {}).get("temporal")
    status: dict = {"run_id": args.run, "launch_pid": (launch or {}).get("pid"), "ui": (launch or {}).get("ui")}
    if address:
        try:
            live = asyncio.run(live_progress(address, (launch or {}).get("namespace", args.temporal_namespace),
                                             args.run))
            status.update(live)
            if "step" in live:  # running: its own numbers; ended: the store's
                status["source"] = "workflow"
        except (VimeError, RuntimeError, RPCError) as e:  # unreachable, no such workflow, no worker: the store says
            status["live_error"] = str(e).splitlines()[0]
    if "source" not in status:
        with open_existing(store_for(args)) as store:
            summary = next((s for s in run_summaries(store) if s.run_id == args.run), None)
        if summary is None:
            status.update(source="store", state="unknown run")
        else:
            status.update(source="store", step=summary.steps_trained, num_rollout=summary.num_rollout,
                          state=summary.progress if summary.progress == "finished" else "stopped",
                          last_reward=summary.last_reward)
            if status.get("workflow") not in (None, "running"):  # Temporal knows how it ended
                status["state"] = "finished" if status["workflow"] == "completed" else status["workflow"]
    if args.json:
        print(json.dumps(status, indent=1, default=str))
        return 0
    print(_line(status))
    return 0


def _line(s: dict) -> str:
    where = f"step {s.get('step', '?')}/{s.get('num_rollout', '?')}"
    if s["source"] == "workflow":
        last = next((m for m in reversed(s.get("metrics") or []) if not m.get("eval_only")), {})
        reward = last.get("reward_mean")
        return (f"run {s['run_id']}: {s['workflow']}, {where}, phase {s.get('phase')}, policy version "
                f"{s.get('weight_version')}" + (f", last reward {reward:.3f}" if reward is not None else "")
                + (f", checkpoint {s['checkpoint']}" if s.get("checkpoint") else "")
                + (f"; Web UI {s['ui']}" if s.get("ui") else ""))
    if s.get("state") == "unknown run":
        return f"run {s['run_id']}: not in the store; `vime runs` lists the runs"
    reward = ("" if s.get("last_reward") is None else f", last reward {s['last_reward']:.3f}")
    workflow = s.get("workflow")
    if workflow == "running":  # its workflow runs, but nothing answered for it
        return (f"run {s['run_id']}: its workflow is running, at {where} in the store{reward}, but no worker "
                "answered its query: are the run's workers (or its launch) up?")
    if workflow:  # it ended: say how, from Temporal
        return (f"run {s['run_id']}: its workflow {workflow} at {where}{reward}"
                + ("" if workflow == "completed" else "; the same `vime train` command, or `temporal workflow "
                   "start` with its `vime config` JSON, starts it again from its last checkpoint")
                + (f"; {s['notice']}" if s.get("notice") else ""))
    return (f"run {s['run_id']}: {s['state']} at {where} (no launch running){reward}"
            + ("" if s["state"] == "finished" else "; the same `vime train` command resumes it"))
