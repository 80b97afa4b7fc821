"""Fully async mode (`--fully-async`): a pool of prompt groups always in flight, each step built
from groups in the order they finish, within `--max-staleness` weight versions.

- One group 20x slower than the rest never delays a step: the steps go on without it, and it is
  either trained later within the bound or dropped and counted (`dropped_groups`).
- Killing the rollout worker and the trainer mid-run, then Ctrl-C and the same command again,
  loses nothing and trains nothing twice.
- Every group of every step is at most `--max-staleness` versions old when trained, and every
  stored sample is trained once, or belongs to a group that was counted as dropped or cancelled.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from tests.runs import TrainRun
from vime.store import SampleStore
from vime.temporal.dev_server import TemporalDevServer, temporal_cli_path

pytestmark = pytest.mark.vllm

SLOW_GROUP = 1  # the prompt position whose every rollout is the long tail
SLOW_HOOK = """
import asyncio, pathlib, time
from vime.rollout.generate import generate as vllm_generate

async def generate(args, sample, sampling_params):
    if sample.group_index == {slow}:
        marks = pathlib.Path({marks!r})
        (marks / "tail-started").write_text(str(time.time()))
        await asyncio.sleep({seconds})
        (marks / "tail-done").write_text(str(time.time()))
    return await vllm_generate(args, sample, sampling_params)
"""


def summary(run: TrainRun) -> dict:
    return json.loads((run.run_dir / "summary.json").read_text())


def assert_accounted_for(run: TrainRun, max_staleness: int) -> dict:
    """Every step trained `groups x n` samples once, within the staleness bound; every other stored
    sample belongs to a group counted as dropped (past the bound: cancelled if it was still
    generating) or cancelled (a spare at the run's end)."""
    metrics = summary(run)["metrics"]
    assert run.trained_counts() == {step: run.groups * run.n for step in range(run.steps)}, run.tail()
    with SampleStore.open(run.run_dir) as store:
        manifests = [store.read_step_manifest(run.run_id, step) for step in range(run.steps)]
        untrained = store.count_samples(run.run_id, untrained=True)
    staleness = [s for m in manifests for s in m.meta["staleness"]]
    assert max(staleness) <= max_staleness, staleness
    dropped = sum(m.get("dropped_groups", 0) for m in metrics)
    cancelled = metrics[-1].get("groups_cancelled", 0)
    # a dropped or cancelled group is stored when it had finished, and not when it was stopped mid-way
    assert untrained <= (dropped + cancelled) * run.n, (untrained, dropped, cancelled)
    assert untrained % run.n == 0  # whole groups only
    return {"staleness": staleness, "dropped": dropped, "cancelled": cancelled,
            "positions": [p for m in manifests for p in m.meta["positions"]]}


def test_a_long_tail_group_never_delays_a_step(training_server, tiny_model_dir, tmp_path, capsys):
    normal = 0.5  # about one group's generation here; the tail sleeps 20x that before generating
    tail_seconds = 20 * normal * 2
    (tmp_path / "slow_tail.py").write_text(SLOW_HOOK.format(slow=SLOW_GROUP, marks=str(tmp_path),
                                                            seconds=tail_seconds))
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--fully-async", "--max-staleness", "1",
                   "--max-concurrent-rollouts", "3", "--custom-generate-function-path", "slow_tail.generate",
                   steps=10, groups=2, n=4)
    try:
        assert run.run_to_end(900) == 0, run.tail()
        metrics = summary(run)["metrics"]
        started = float((tmp_path / "tail-started").read_text())
        done = float((tmp_path / "tail-done").read_text()) if (tmp_path / "tail-done").exists() else float("inf")
        during = [m["step"] for m in metrics if started < m["finished_at"] < done]
        waits = [round(m["rollout_wait_seconds"], 1) for m in metrics]
        with capsys.disabled():
            print(f"\n[async] steps finished while the tail group ran: {during}; rollout waits per step {waits}")
        assert len(during) >= 3, (during, waits)  # the steps went on without the tail
        assert max(waits) < tail_seconds / 2, waits
        accounted = assert_accounted_for(run, max_staleness=1)
        if SLOW_GROUP not in accounted["positions"]:  # not trained: dropped past the bound (or cancelled)
            assert accounted["dropped"] + accounted["cancelled"] >= 1, accounted
        assert "stale " in run.output()
        run.assert_nothing_left()
    finally:
        run.kill_all()


def test_kill_9_of_each_worker_then_ctrl_c_and_rerun_in_fully_async_mode_loses_nothing(
        training_server, tiny_model_dir, tmp_path, capsys):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--fully-async", "--max-staleness", "1",
                   "--max-concurrent-rollouts", "4", steps=12, groups=2, n=4)
    try:
        run.start()
        for kind, at_step in (("rollout", 2), ("trainer", 5)):
            run.wait_for_step(at_step, 600)
            os.kill(run.pid(kind), signal.SIGKILL)
            t0, done = time.monotonic(), run.steps_done()
            run.wait_for_step(done + 1, 600)
            with capsys.disabled():
                print(f"\n[async chaos] kill -9 of the {kind} worker after step {done}: the next step finished "
                      f"{time.monotonic() - t0:.1f} s later")
        run.wait_for_step(6, 600)
        assert run.stop(signal.SIGINT) == 130, run.tail()
        stopped = run.output(run.launches)
        assert "worker rollout died" in stopped and "worker trainer died" in stopped
        assert "resume with:" in stopped and "Traceback" not in stopped, stopped[-3000:]
        run.assert_nothing_left()
        t0 = time.monotonic()
        assert run.run_to_end(600) == 0, run.tail()  # the same command resumes the pool and the steps
        with capsys.disabled():
            print(f"\n[async chaos] Ctrl-C after step 6, then the same command: finished in "
                  f"{time.monotonic() - t0:.1f} s")
        assert_accounted_for(run, max_staleness=1)
        # a re-attached trainer (after its kill, and the rerun's) pushes the same policy under the
        # same version: only a trained step makes groups older
        assert [m["weight_version"] for m in summary(run)["metrics"]] == list(range(1, run.steps + 1))
        run.assert_nothing_left()
    finally:
        run.kill_all()


def test_the_fully_async_example_learns_when_started_by_upstreams_rollout_function(training_server, tmp_path):
    run_dir = tmp_path / "fully_async"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    result = subprocess.run(
        [sys.executable, "-m", "examples.fully_async.run", "--run-dir", str(run_dir), *engine_flags(training_server),
         "--rollout-function-path", "vime.rollout.fully_async_rollout.generate_rollout_fully_async"],
        check=False, capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent, env=env, timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    line = (run_dir / "summary.txt").read_text()
    first = float(line.split("mean reward ")[1].split(" ")[0])
    last = float(line.split("-> ")[1].split(" ")[0])
    assert first < 0.5 and last >= 0.9, line
    metrics = json.loads((run_dir / "summary.json").read_text())["metrics"]
    assert all(m["staleness_max"] <= 1 for m in metrics)
    assert any(m["staleness_max"] == 1 for m in metrics)  # rollouts did overlap training
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert_rollout_groups_are_searchable(run_dir, run_dir.name, metrics)


def assert_rollout_groups_are_searchable(run_dir: Path, run_id: str, metrics: list[dict]) -> None:
    """After the run, its own history (temporal.db in the run directory) answers the README's
    query: the rollout groups that scored >= 0.5, with their search attributes."""
    with TemporalDevServer(run_dir, headless=True) as server:
        listed = subprocess.run(
            [str(temporal_cli_path()), "workflow", "list", "--address", server.address, "--limit", "1000", "-o", "json",
             "--query", f"VimeRunId='{run_id}' AND Reward >= 0.5"],
            check=True, capture_output=True, text=True, timeout=60)
    groups = json.loads(listed.stdout or "[]")
    assert groups and all(g["type"]["name"] == "RolloutWorkflow" for g in groups), listed.stdout[:2000]
    good_steps = sum(m["reward_mean"] >= 0.5 for m in metrics)  # each has a group scoring >= 0.5
    assert len(groups) >= good_steps > 0, (len(groups), good_steps)
