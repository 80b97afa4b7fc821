"""`vime status RUN`: where a run stands. Live from its training workflow's `progress` query while
a launch of it runs (the launch's Temporal, from `<run-dir>/launch.json`) or at `--temporal-address`,
with what it waits for (`vime.ops.waiting`); from the store once it has ended or stopped (with what
starting it again will do, `vime.ops.restart`). `--follow` then prints a line per step and each
waiting reason until the run ends (`vime.ops.watch`)."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

from temporalio.service import RPCError

from vime.errors import ConfigError, VimeError
from vime.ops.commands import run_parser
from vime.ops.locate import open_existing, run_dir_of, store_for, temporal_for
from vime.ops.queries import run_summaries
from vime.temporal.restart_plan import recorded, restart_plan
from vime.ops.waiting import engine_urls_of, observe, reason
from vime.ops.watch import Watch
from vime.rundir import read_launch_info
from vime.temporal.client import connect
from vime.temporal.training_contract import PROGRESS_QUERY

QUERY_TIMEOUT_S = 10


async def live_progress(address: str, namespace: str, run_id: str, engine_urls: list[str] | None = None) -> dict:
    client = await connect(address, namespace)
    handle = client.get_workflow_handle(f"train-{run_id}")
    described = await handle.describe()
    if described.status.name != "RUNNING":  # its memo's notice: why it ended so (a finished run started again)
        notice = (await described.memo()).get("notice")
        return {"workflow": described.status.name.lower(), **({"notice": notice} if notice else {})}
    seen = await observe(client, described, engine_urls or [])
    waiting = reason(seen)
    live: dict = {"workflow": "running", **({"waiting": waiting} if waiting else {})}
    if described.task_queue in seen.idle_queues:  # nobody to answer the query: do not wait for its timeout
        return {**live, "live_error": f"no worker polls task queue {described.task_queue!r}"}
    try:  # answered by a worker of the run: none when no launch (or worker pool) is up
        progress = await handle.query(PROGRESS_QUERY, rpc_timeout=timedelta(seconds=QUERY_TIMEOUT_S))
    except RPCError as e:
        return {**live, "live_error": f"no worker answered its query ({e.message})"}
    return {**live, **progress}


async def follow(address: str, namespace: str, run_id: str, engine_urls: list[str], store: str) -> int:
    watch = Watch(await connect(address, namespace), run_id, lambda: restart_plan(recorded(store, run_id)),
                  engine_urls)
    return await watch.follow()


def status_main(argv: list[str]) -> int:
    parser = run_parser("vime status", "Where a run stands: live from its workflow while it runs, else from its "
                        "store.")
    parser.add_argument("--temporal-address", help="the Temporal the run lives in (default: its running launch's)")
    parser.add_argument("--temporal-namespace", default="default")
    parser.add_argument("--follow", action="store_true", help="then print a line per step (as `vime train` does) "
                        "and why the run waits, until it ends or Ctrl-C")
    args = parser.parse_args(argv)
    run_dir = run_dir_of(args.run, args.run_dir)
    launch = read_launch_info(run_dir)
    address = temporal_for(args, launch)
    namespace = (launch or {}).get("namespace", args.temporal_namespace)
    if args.follow and not address:
        raise VimeError(f"vime status --follow: run {args.run!r} has no running launch (no launch.json in {run_dir}); "
                        "pass --temporal-address HOST:PORT of the Temporal it lives in")
    engines = _engine_urls(args)
    status: dict = {"run_id": args.run, "launch_pid": (launch or {}).get("pid"), "ui": (launch or {}).get("ui")}
    if address:
        try:
            live = asyncio.run(live_progress(address, namespace, args.run, engines))
            status.update(live)
            if "step" in live:  # running: its own numbers; ended: the store's
                status["source"] = "workflow"
        except (VimeError, RuntimeError, RPCError) as e:  # unreachable, no such workflow, no worker: the store says
            status["live_error"] = str(e).splitlines()[0]
    if "source" not in status:
        try:
            with open_existing(store_for(args)) as store:
                summary = next((s for s in run_summaries(store) if s.run_id == args.run), None)
        except ConfigError:  # no store here: a running workflow (on workers elsewhere) is still worth following
            if status.get("workflow") != "running":
                raise
            summary = None
        if summary is None:
            status.update(source="store", state="unknown run")
        else:
            status.update(source="store", step=summary.steps_trained, num_rollout=summary.num_rollout,
                          state=summary.progress if summary.progress == "finished" else "stopped",
                          last_reward=summary.last_reward)
            if status.get("workflow") not in (None, "running"):  # Temporal knows how it ended
                status["state"] = "finished" if status["workflow"] == "completed" else status["workflow"]
    if args.json and not args.follow:
        print(json.dumps(status, indent=1, default=str))
        return 0
    if args.follow:  # followed: the reason comes on its own `[wait]` line
        status.pop("waiting", None)
    print(_line(status, store_for(args)), flush=True)
    if not args.follow:
        return 0
    try:
        return asyncio.run(follow(address, namespace, args.run, engines, store_for(args)))
    except KeyboardInterrupt:
        print(f"[vime] stopped following run {args.run} (the run goes on)", flush=True)
        return 130
    except RPCError as e:
        raise VimeError(f"vime status --follow: Temporal at {address}: {e.message}") from None


def _engine_urls(args) -> list[str]:
    """The run's vLLM servers, from the flags its store recorded (none when it is not readable here)."""
    try:
        with open_existing(store_for(args)) as store:
            return engine_urls_of(store.run_argv(args.run))
    except VimeError:
        return []


def _line(s: dict, store: str) -> str:
    where = f"step {s.get('step', '?')}/{s.get('num_rollout', '?')}"
    if s["source"] == "workflow":
        last = next((m for m in reversed(s.get("metrics") or []) if not m.get("eval_only")), {})
        reward = last.get("reward_mean")
        return (f"run {s['run_id']}: {s['workflow']}, {where}, phase {s.get('phase')}, policy version "
                f"{s.get('weight_version')}" + (f", last reward {reward:.3f}" if reward is not None else "")
                + (f", checkpoint {s['checkpoint']}" if s.get("checkpoint") else "")
                + (f"; Web UI {s['ui']}" if s.get("ui") else "")
                + (f"; {s['waiting']}" if s.get("waiting") else ""))
    reward = ("" if s.get("last_reward") is None else f", last reward {s['last_reward']:.3f}")
    workflow = s.get("workflow")
    if workflow == "running":  # its workflow runs, but nothing answered for it
        stored = "" if s.get("state") == "unknown run" else f", at {where} in the store{reward}"
        return (f"run {s['run_id']}: its workflow is running{stored}, but no worker answered its query: "
                + (s.get("waiting") or "are the run's workers (or its launch) up?"))
    if s.get("state") == "unknown run":
        return f"run {s['run_id']}: not in the store; `vime runs` lists the runs"
    if workflow:  # it ended: say how, from Temporal
        return (f"run {s['run_id']}: its workflow {workflow} at {where}{reward}"
                + ("" if workflow == "completed" else f"; {restart_plan(recorded(store, s['run_id']))}")
                + (f"; {s['notice']}" if s.get("notice") else ""))
    return (f"run {s['run_id']}: {s['state']} at {where} (no launch running){reward}"
            + ("" if s["state"] == "finished" else f"; {restart_plan(recorded(store, s['run_id']))}"))
