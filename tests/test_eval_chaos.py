"""Eval rounds of `vime train --eval-interval` under failure (the shared training server): kill -9
of the rollout worker during a round, then SIGTERM of the launcher during a later round and the
same command: every round completes once, no eval prompt is generated or graded twice, each
result is recorded once, and the round's workflows are found by `temporal workflow list --query
"VimeRunId='X' AND VimeEval=true"`."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess

import pytest

from tests.conftest import engine_flags
from tests.runs import TrainRun
from vime.rollout.policy_check import sampled_versions
from vime.rundir import LAUNCH_INFO
from vime.store import SampleStore
from vime.temporal.dev_server import temporal_cli_path

pytestmark = pytest.mark.vllm

PROMPTS, N = 24, 2


def eval_samples(run: TrainRun, step: int) -> int:
    if not (run.run_dir / "vime.db").exists():
        return 0
    with SampleStore.open(run.run_dir) as store, store.engine.connect() as conn:
        return conn.exec_driver_sql("SELECT COUNT(*) FROM samples WHERE eval_step = ?", (step,)).scalar()


def eval_workflows(run: TrainRun) -> list[str]:
    """The ids `temporal workflow list --query "VimeRunId='run' AND VimeEval=true"` lists, asked
    of the live launch's Temporal."""
    address = json.loads((run.run_dir / LAUNCH_INFO).read_text())["temporal"]
    out = subprocess.run([str(temporal_cli_path()), "workflow", "list", "--address", address, "--query",
                          f"VimeRunId='{run.run_id}' AND VimeEval=true", "--limit", "1000", "-o", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    text = out.stdout.strip()
    try:
        listed = json.loads(text or "[]")
    except json.JSONDecodeError:  # one object a line
        listed = [json.loads(line) for line in text.splitlines() if line.strip()]
    return sorted(w["execution"]["workflowId"] for w in (listed if isinstance(listed, list) else [listed]))


def progress(run: TrainRun) -> dict:
    """The training workflow's `progress` query, asked of the live launch's Temporal ({} before it answers)."""
    from temporalio.client import Client
    from temporalio.service import RPCError

    async def ask() -> dict:
        address = json.loads((run.run_dir / LAUNCH_INFO).read_text())["temporal"]
        client = await Client.connect(address)
        return await client.get_workflow_handle(f"train-{run.run_id}").query("progress")
    try:
        return asyncio.run(ask())
    except (FileNotFoundError, RPCError, ConnectionError, RuntimeError):
        return {}


def test_kill_9_of_the_rollout_worker_and_sigterm_during_eval_rounds_each_round_completes_once(
        training_server, tiny_model_dir, tmp_path):
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": f"count {i}", "label": "1"}) + "\n" for i in range(PROMPTS)))
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--eval-interval", "2",
                   "--eval-prompt-data", "heldout", str(heldout), "--n-samples-per-eval-prompt", str(N),
                   "--eval-max-response-len", "12", steps=3, groups=2, n=2)
    try:
        run.start()
        run.wait_for(lambda: eval_samples(run, 0) >= 4, 300, "the baseline round's first eval samples")
        os.kill(run.pid("rollout"), signal.SIGKILL)
        run.wait_for(lambda: "worker rollout died" in run.output(1), 60, "the launcher to see the worker die")
        listed = eval_workflows(run)
        assert listed and all(w.startswith(f"{run.run_id}-eval0-heldout-") for w in listed), listed
        run.wait_for(lambda: eval_samples(run, 2) >= 4, 600, "the round at step 2")
        assert run.stop(signal.SIGTERM) == 143, run.tail()
        run.assert_nothing_left(60)
        assert run.run_to_end(timeout=900) == 0, run.tail()
    finally:
        run.kill_all()
    assert "is in progress; continuing it" in run.output(2)
    assert "in 3 round(s) beside" in run.output(2)  # the closing line prices the rounds
    run.assert_trained_exactly_once()
    with SampleStore.open(run.run_dir) as store:
        rounds = store.eval_rounds(run.run_id)
        assert [(r.step, r.weight_version) for r in rounds] == [(0, 0), (2, 2), (3, 3)]
        for r in rounds:
            samples = [s for _, s in store.iter_samples(run.run_id, evaluation=True, eval_step=r.step)]
            assert len(samples) == PROMPTS * N == r.metrics["eval/heldout/samples"]
            assert all(set(sampled_versions(s)) == {r.weight_version} for s in samples), r.step
        with store.engine.connect() as conn:
            twice = conn.exec_driver_sql("SELECT eval_step, rollout_id, sibling FROM samples WHERE eval_step IS NOT "
                                         "NULL GROUP BY eval_step, rollout_id, sibling HAVING COUNT(*) > 1").all()
            recorded = conn.exec_driver_sql("SELECT step, COUNT(*) FROM eval_rounds GROUP BY step").all()
        assert twice == [] and sorted(recorded) == [(0, 1), (2, 1), (3, 1)]


ROUND_GATE = '''
import asyncio
from pathlib import Path

GATE = Path(__file__).with_name("round-gate")


async def rm(args, sample, **kwargs):
    """An eval prompt ("count N") is scored once the test removes the gate file, so the round
    samples (and holds its syncs) as long as the test needs; training prompts score at once."""
    while not str(sample.prompt).startswith("count to") and GATE.exists():
        await asyncio.sleep(0.2)
    return float(sample.response.strip() == sample.label)
'''


def test_kill_9_of_the_trainer_while_a_fully_async_round_holds_the_syncs_keeps_the_round_on_its_version(
        training_server, tiny_model_dir, tmp_path):
    """The trainer trained past the round's boundary (its sync held) and dies while the round
    samples: the re-attached trainer pushes the round's version again, not its own, replays the
    held steps, and the held sync goes out once the round's generation ends. The round's reward
    waits on a gate the test opens after the kill (a window found by polling was missed once)."""
    prompts = 16
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps({"prompt": f"count {i}", "label": "1"}) + "\n" for i in range(prompts)))
    (tmp_path / "gate.py").write_text(ROUND_GATE)
    gate = tmp_path / "round-gate"
    gate.touch()
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--fully-async", "--max-staleness", "1",
                   "--max-concurrent-rollouts", "4", "--eval-interval", "2", "--skip-eval-before-train",
                   "--eval-prompt-data", "heldout", str(heldout), "--n-samples-per-eval-prompt", str(N),
                   "--eval-max-response-len", "24", "--custom-rm-path", "gate.rm", steps=4, groups=2, n=2)

    def held_during_round() -> bool:  # a step trained while round 2 samples (its eval groups wait on the gate)
        return progress(run).get("held_syncs", 0) >= 1

    try:
        run.start()
        run.wait_for(held_during_round, 600, "a step trained while round 2 samples, its sync held")
        os.kill(run.pid("trainer"), signal.SIGKILL)
        run.wait_for(lambda: "worker trainer died" in run.output(), 120, "the launcher to see the trainer die")
        gate.unlink()
        assert run.wait() == 0, run.tail()
    finally:
        run.kill_all()
    run.assert_on_policy(max_staleness=1)
    with SampleStore.open(run.run_dir) as store:
        rounds = store.eval_rounds(run.run_id)
        assert [(r.step, r.weight_version) for r in rounds] == [(2, 2), (4, 4)]
        for r in rounds:
            samples = [s for _, s in store.iter_samples(run.run_id, evaluation=True, eval_step=r.step)]
            assert len(samples) == prompts * N
            assert all(set(sampled_versions(s)) == {r.weight_version} for s in samples), r.step
    metrics = {m["step"]: m for m in json.loads((run.run_dir / "summary.json").read_text())["metrics"]}
    assert metrics[2]["eval_weight_version"] == 2 and any(metrics[s].get("sync_held") for s in (2, 3))
