"""Where one training step's seconds go: rollout, train and sync, each broken into its parts.

    python bench/step_profile.py [--steps 4] [--max-response-len 16] [quickstart flags ...]
    python bench/step_profile.py --run-dir runs/RUN     # a run that already ran
    python bench/step_profile.py --no-overlap           # the synchronous run only

Without `--run-dir` it runs the quickstart (`examples.quickstart.run`, `--num-rollout STEPS`) in
a fresh run directory first. Then it reads what every run records and prints the median over
the steps after the first (the first step warms caches and compiles):

- `metrics.jsonl`: the workflow's phases (`rollout_wait_seconds`, `train_phase_seconds`,
  `sync_seconds`) and the trainer's `perf/train_*` timers (`vime.train.trainer`);
- each step's manifest in the store: `meta["perf"]`, the rollout activity's timers
  (`vime.rollout.phase_times`, the mean over the step's groups);
- the Temporal history (a dev server on the run's `temporal.db`): for each group, the training
  workflow's start command → the child started, → its first workflow task, → its local activity's
  marker (the group generated), → the child completed, → the training workflow's task that saw it.

Then (unless `--run-dir` or `--no-overlap`) it runs the same quickstart overlapped
(`--max-staleness 1`: the next step's rollouts are collected while the current one trains) and
prints both runs' median seconds per step, between step ends (`finished_at`), with each one's
median rollout wait: in the overlapped run the workflow waits only for what the prefetch has not
finished.

The figures and how to read them: docs/performance.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.api.enums.v1 import EventType  # noqa: E402
from temporalio.client import Client  # noqa: E402

from vime.metrics_log import METRICS_FILE  # noqa: E402
from vime.store import SampleStore  # noqa: E402
from vime.temporal.client import connect  # noqa: E402
from vime.temporal.dev_server import TemporalDevServer  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
E = EventType


def run_quickstart(run_dir: Path, steps: int, max_response_len: int, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir), "--num-rollout", str(steps),
           "--rollout-max-response-len", str(max_response_len), "--save-interval", str(steps + 1), *extra]
    print("$", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def step_metrics(run_dir: Path) -> list[dict]:
    lines = [json.loads(line) for line in (run_dir / METRICS_FILE).read_text().splitlines() if line.strip()]
    return [m for m in lines if not m.get("eval_only") and "rollout_wait_seconds" in m]


def manifests(run_dir: Path, run_id: str, steps: list[int]) -> dict[int, dict]:
    with SampleStore.open(str(run_dir)) as store:
        return {s: m.meta for s in steps if (m := store.read_step_manifest(run_id, s)) is not None}


def _seconds(a, b) -> float:
    return b.ToDatetime().timestamp() - a.ToDatetime().timestamp()


async def group_timings(client: Client, run_id: str) -> dict[str, dict[str, float]]:
    """Per group workflow id: the seconds of each hop, from the parent's and the child's histories."""
    parent = await client.get_workflow_handle(f"train-{run_id}").fetch_history()
    initiated, started, completed, seen = {}, {}, {}, {}
    pending: list[str] = []  # children completed since the parent's last workflow task started
    by_event: dict[int, str] = {}
    for ev in parent.events:
        if ev.event_type == E.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            wid = ev.start_child_workflow_execution_initiated_event_attributes.workflow_id
            initiated[wid], by_event[ev.event_id] = ev.event_time, wid
        elif ev.event_type == E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
            started[ev.child_workflow_execution_started_event_attributes.workflow_execution.workflow_id] = ev.event_time
        elif ev.event_type == E.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
            wid = ev.child_workflow_execution_completed_event_attributes.workflow_execution.workflow_id
            completed[wid] = ev.event_time
            pending.append(wid)
        elif ev.event_type == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            for wid in pending:
                seen[wid] = ev.event_time
            pending = []
    out = {}
    for wid in initiated:
        if wid not in completed or wid not in seen:
            continue
        child = await client.get_workflow_handle(wid).fetch_history()
        first_task = next((e.event_time for e in child.events
                           if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_STARTED), None)
        marker = next((e for e in child.events if e.event_type == E.EVENT_TYPE_MARKER_RECORDED), None)
        done = next((e for e in child.events if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED), marker)
        if first_task is None or done is None:
            continue
        # a local activity's marker is written when its workflow task completes: that completion is the time
        task_done = next((e.event_time for e in child.events if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
                          and e.event_id < done.event_id), None) if done is not marker else done.event_time
        out[wid] = {"start_child": _seconds(initiated[wid], started[wid]),
                    "to_first_task": _seconds(started[wid], first_task),
                    "first_task_to_generated": _seconds(first_task, task_done or done.event_time),
                    "generated_to_child_completed": _seconds(task_done or done.event_time, completed[wid]),
                    "to_parent_task": _seconds(completed[wid], seen[wid]),
                    "group_total": _seconds(initiated[wid], seen[wid])}
    return out


async def temporal_timings(run_dir: Path, run_id: str) -> dict[str, dict[str, float]]:
    with tempfile.TemporaryDirectory(prefix="vime-profile-") as tmp:
        for suffix in ("", "-wal", "-shm"):  # a copy: the run's own file stays untouched
            if (src := run_dir / f"temporal.db{suffix}").is_file():
                (Path(tmp) / src.name).write_bytes(src.read_bytes())
        server = TemporalDevServer(tmp, headless=True).start()
        try:
            return await group_timings(await connect(server.address, timeout=30), run_id)
        finally:
            server.stop()


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def profile(run_dir: Path, run_id: str, first_step: bool = False) -> list[str]:
    metrics = step_metrics(run_dir)
    measured = (metrics[:1] if first_step else metrics[1:]) or metrics  # the first step warms up
    steps = [m["step"] for m in measured]
    metas = manifests(run_dir, run_id, steps)
    hops = asyncio.run(temporal_timings(run_dir, run_id))
    by_step: dict[int, list[dict]] = defaultdict(list)
    for s, meta in metas.items():
        for pos in meta.get("positions", []):
            if (h := hops.get(f"{run_id}-rollout-{pos}")) is not None:
                by_step[s].append(h)

    def m(key: str) -> float:
        return median([x[key] for x in measured if key in x])

    def group_hop(key: str, how=statistics.mean) -> float:  # per step: the mean (or max) over its groups
        return median([how([h[key] for h in hs]) for hs in by_step.values() if hs])

    def act(key: str, per_sample: bool = False) -> float:
        vals = []
        for meta in metas.values():
            perf = meta.get("perf") or {}
            if key in perf:
                n = meta["samples"] / max(1, meta["groups"]) if per_sample else 1
                vals.append(perf[key] / n)
        return median(vals)

    rollout, train, sync = m("rollout_wait_seconds"), m("train_phase_seconds"), m("sync_seconds")
    train_in = sum(m(k) for k in ("perf/train_load_s", "perf/train_mark_trained_s")) + m("train_seconds")
    samples = int(median([meta["samples"] for meta in metas.values()]) or 0)
    groups = int(median([meta["groups"] for meta in metas.values()]) or 0)
    rows = [
        f"run {run_id}: median of steps {steps[0]}..{steps[-1]} "
        f"({groups} groups x {samples // max(1, groups)} samples)",
        f"step                                    {rollout + train + sync:7.3f} s",
        f"  rollout (the workflow waits)          {rollout:7.3f} s",
        f"    slowest group, start → parent saw it {group_hop('group_total', max):7.3f} s",
        "    per group (mean):",
        f"      start child workflow              {group_hop('start_child'):7.3f} s",
        f"      child started → first task        {group_hop('to_first_task'):7.3f} s",
        f"      first task → group generated      {group_hop('first_task_to_generated'):7.3f} s (the local activity)",
        f"        run context, prompts, checks    {act('context'):7.3f} s",
        f"        run_group (all samples, wall)   {act('run_group'):7.3f} s",
        f"          per sample: HTTP to vLLM      {act('http', True):7.3f} s",
        f"          per sample: tokenization      {act('tokenize', True):7.3f} s",
        f"          per sample: reward            {act('reward', True):7.3f} s",
        f"        store write                     {act('store'):7.3f} s",
        f"      generated → child completed       {group_hop('generated_to_child_completed'):7.3f} s",
        f"      child completed → parent's task   {group_hop('to_parent_task'):7.3f} s",
        f"  train (the workflow waits)            {train:7.3f} s",
        f"    load samples from the store         {m('perf/train_load_s'):7.3f} s",
        f"    batching and packing plan           {m('perf/train_batching_s'):7.3f} s",
        f"    logprob recompute (old, ref)        {m('perf/train_logprobs_s'):7.3f} s",
        f"    advantages                          {m('perf/train_advantages_s'):7.3f} s",
        f"    forward + backward (+ clip)         {m('perf/train_forward_backward_s'):7.3f} s",
        f"    optimizer step                      {m('perf/train_optimizer_s'):7.3f} s",
        f"    mark trained                        {m('perf/train_mark_trained_s'):7.3f} s",
        f"    Temporal and the trainer's RPC      {train - train_in:7.3f} s (the rest)",
        f"  sync weights                          {sync:7.3f} s",
    ]
    return rows


def step_seconds(run_dir: Path) -> tuple[float, float]:
    """(median s/step between step ends after the first, median rollout wait of those steps)."""
    metrics = sorted(step_metrics(run_dir), key=lambda m: m["step"])
    ends = [m["finished_at"] for m in metrics]
    return (median([b - a for a, b in zip(ends, ends[1:])]),
            median([m["rollout_wait_seconds"] for m in metrics[1:]]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", help="profile this run (default: run the quickstart first)")
    parser.add_argument("--run-id", help="the run's id (default: launch.json's, else the run directory's name)")
    parser.add_argument("--steps", type=int, default=4, help="quickstart steps to run")
    parser.add_argument("--max-response-len", type=int, default=16, help="the quickstart's --rollout-max-response-len")
    parser.add_argument("--first-step", action="store_true",
                        help="profile the run's first step alone (its warm-up: what a fast start pays)")
    parser.add_argument("--no-overlap", action="store_true", help="skip the overlapped run (--max-staleness 1)")
    args, extra = parser.parse_known_args(argv)
    if args.run_dir:
        run_dir = Path(args.run_dir)
    else:
        run_dir = Path(tempfile.mkdtemp(prefix="vime-step-profile-")) / f"profile-r{args.max_response_len}"
        run_quickstart(run_dir, args.steps, args.max_response_len, extra)
    launch = run_dir / "launch.json"
    run_id = args.run_id or (json.loads(launch.read_text())["run_id"] if launch.is_file() else run_dir.name)
    for row in profile(run_dir, run_id, first_step=args.first_step):
        print(row)
    if args.run_dir or args.no_overlap:
        return 0
    overlapped = run_dir.with_name(run_dir.name + "-overlap")
    run_quickstart(overlapped, args.steps, args.max_response_len, [*extra, "--max-staleness", "1"])
    print("median s/step between step ends (steps 1..):")
    for name, d in (("synchronous", run_dir), ("overlapped (--max-staleness 1)", overlapped)):
        step, wait = step_seconds(d)
        print(f"  {name:<32}{step:7.3f} s/step (rollout wait {wait:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
