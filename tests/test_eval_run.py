"""Eval rounds in a real `vime train` run (the shared training server): rounds at step 0, every
--eval-interval steps and after the last, each eval sample from the round's one policy version,
stored as the round's, never trained, and the figures in metrics.jsonl and on the console."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from temporalio.client import Client
from temporalio.worker import Replayer

from tests.conftest import engine_flags
from tests.test_metrics_log import scalars
from tests.test_metrics_wandb import WANDB_HOMES, offline_runs
from vime.metrics.tags import GROUPS
from vime.metrics_log import read_metrics
from vime.rollout.policy_check import sampled_versions
from vime.store import SampleStore
from vime.temporal.dev_server import TemporalDevServer
from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent


def write_jsonl(path: Path, records: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_a_run_evaluates_at_0_every_n_steps_and_after_the_last_on_one_policy_version_each(
        training_server, tiny_model_dir, tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"say {i}", "label": "1"} for i in range(8)])
    heldout = write_jsonl(tmp_path / "heldout.jsonl", [{"q": f"count {i}", "a": "1"} for i in range(3)])
    steps, n = 5, 4
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label", "--rm-type", "exact_match",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(steps),
            "--rollout-max-response-len", "6", "--run-dir", str(tmp_path / "run"),
            "--eval-interval", "2", "--eval-prompt-data", "heldout", str(heldout), "--eval-input-key", "q",
            "--eval-label-key", "a", "--n-samples-per-eval-prompt", str(n), "--eval-max-response-len", "4",
            "--use-wandb", *engine_flags(training_server)]
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING", "WANDB_MODE": "offline",
           "WANDB_SILENT": "true", **{name: str(tmp_path / "wandb-home") for name in WANDB_HOMES}}
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "finished: 5 steps" in result.stdout
    assert "[eval] after step 5/5 | eval heldout" in result.stdout
    assert result.stdout.count("| eval heldout") == 4, result.stdout  # rounds 0, 2, 4 on step lines, 5 on its own

    rounds = [0, 2, 4, 5]
    with SampleStore.open(tmp_path / "run") as store:
        assert [r.step for r in store.eval_rounds("run")] == rounds
        for r in store.eval_rounds("run"):
            assert r.weight_version == r.step  # synchronous: the round at step k evaluates policy version k
            evals = [s for _, s in store.iter_samples("run", evaluation=True, eval_step=r.step)]
            assert len(evals) == 3 * n and {s.metadata["eval_set"] for s in evals} == {"heldout"}
            assert all(s.metadata["weight_version"] == r.step for s in evals)
            assert all(set(sampled_versions(s)) == {r.step} for s in evals), "one recorded policy version"
            assert all(s.response_length <= 4 for s in evals)  # --eval-max-response-len, not the rollout's 6
            assert r.metrics["eval/heldout/samples"] == 3 * n and "eval/heldout/pass@4" in r.metrics
        with store.engine.connect() as conn:
            trained_evals = conn.exec_driver_sql(
                "SELECT COUNT(*) FROM samples WHERE eval_step IS NOT NULL AND trained_step IS NOT NULL").scalar()
            manifests = [json.loads(ids) if isinstance(ids, str) else ids for (ids,) in
                         conn.exec_driver_sql("SELECT rollout_ids FROM step_manifests").all()]
        assert trained_evals == 0
        assert not any(rid.startswith("eval") for ids in manifests for rid in ids)
        assert store.count_samples("run") == steps * 2 * 2  # the training samples: evals are apart

    metrics = read_metrics(tmp_path / "run")
    by_step = {m["step"]: m for m in metrics}
    assert sorted(s for s, m in by_step.items() if "eval/heldout/pass@1" in m) == rounds
    assert by_step[5].get("eval_only") and "reward_mean" not in by_step[5]
    for s in rounds:
        assert by_step[s]["eval_weight_version"] == s
        assert 0 <= by_step[s]["eval/heldout/pass@1"] <= by_step[s]["eval/heldout/pass@4"] <= 1
    assert not any(k.startswith("eval") for k in by_step[1])  # no round before step 1
    tensorboard = scalars(tmp_path / "run")  # the same figures in TensorBoard, at the rounds' steps
    assert [step for step, _ in tensorboard["eval/heldout/reward_mean"]] == rounds
    assert [value for _, value in tensorboard["eval/heldout/pass@4"]] == [by_step[s]["eval/heldout/pass@4"]
                                                                         for s in rounds]
    assert "rollout/reward_mean" in tensorboard and {tag.split("/")[0] for tag in tensorboard} <= set(GROUPS)
    assert all(m["entropy"] > 0 for m in metrics if not m.get("eval_only")), "README's entropy, every step"
    assert [step for step, _ in tensorboard["train/entropy"]] == [s for s in by_step if s < 5]
    wandb_rows = [row for launch in offline_runs(tmp_path / "run") for row in launch["rows"]]
    assert [row["_step"] for row in wandb_rows] == sorted(by_step), "W&B (offline): each line once"
    assert wandb_rows[2]["rollout/reward_mean"] == pytest.approx(by_step[2]["reward_mean"])

    compared = subprocess.run([sys.executable, "-m", "vime.cli", "eval", "--compare", str(tmp_path / "run"),
                               str(tmp_path / "run"), "--json"], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert compared.returncode == 0, compared.stderr  # a real run's rounds, read from its store alone
    table = json.loads(compared.stdout)
    assert [r["step"] for r in table["rows"]] == rounds and table["notes"] == [] and table["ks"] == {"heldout": 4}
    assert all(r["reward_mean"]["diff"] == 0 for r in table["rows"])


EVAL_FUNCTION = '''
from vime.rollout.vllm_rollout import generate_rollout


async def evaluate(args, rollout_id, data_source, evaluation=False):
    """slime's eval hook: vime's own eval rollout, every sample tagged."""
    groups = await generate_rollout(args, rollout_id, data_source, evaluation=True)
    for group in groups:
        for sample in group:
            sample.metadata["by"] = "eval hook"
    return groups
'''


SLOW_GRADER = '''
import asyncio


async def rm(args, sample):
    """Exact match; grading a held-out prompt takes 1.5 s (a grader's latency, as a test suite's or
    a judge model's would): the round lasts long enough for steps to train beside it."""
    if str(sample.prompt).startswith("count"):
        await asyncio.sleep(1.5)
    return float(str(sample.response).strip() == str(sample.label))
'''


async def replay_training_history(run_dir: Path, run_id: str) -> None:
    """The run's training workflow history, read back from its Temporal file and replayed
    against the current workflow code: the held syncs and the round beside training are
    rebuilt from the history (what a worker killed mid-round relies on)."""
    server = TemporalDevServer(run_dir, headless=True)
    server.start()
    try:
        client = await Client.connect(server.address)
        history = await client.get_workflow_handle(f"train-{run_id}").fetch_history()
    finally:
        server.stop()
    result = await Replayer(workflows=[TrainingWorkflow, RolloutWorkflow]).replay_workflow(
        history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure


@pytest.mark.parametrize("evaluator", ["plain", "hook"])
async def test_fully_async_trains_while_a_round_evaluates_each_round_on_exactly_one_policy_version(
        evaluator, training_server, tiny_model_dir, tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [{"prompt": f"say {i}", "label": "1"} for i in range(8)])
    heldout = write_jsonl(tmp_path / "heldout.jsonl", [{"prompt": f"count {i}", "label": "1"} for i in range(8)])
    (tmp_path / "my_eval.py").write_text(EVAL_FUNCTION)
    (tmp_path / "slow_grader.py").write_text(SLOW_GRADER)
    max_staleness = 1
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(tiny_model_dir),
            "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
            "--custom-rm-path", "slow_grader.rm",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", "4",
            "--rollout-max-response-len", "6", "--run-dir", str(tmp_path / "run"), "--fully-async",
            "--max-staleness", str(max_staleness), "--max-concurrent-rollouts", "4",
            "--eval-interval", "2", "--eval-prompt-data", "heldout", str(heldout), "--n-samples-per-eval-prompt", "2",
            *(["--eval-function-path", "my_eval.evaluate"] if evaluator == "hook" else []),
            *engine_flags(training_server)]
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    with SampleStore.open(tmp_path / "run") as store:
        rounds = store.eval_rounds("run")
        assert [r.step for r in rounds] == [0, 2, 4]
        for r in rounds:
            assert r.weight_version == r.step  # the held sync pushed every step trained before the round
            evals = [s for _, s in store.iter_samples("run", evaluation=True, eval_step=r.step)]
            assert len(evals) == 16
            assert all(s.metadata.get("by") == "eval hook" for s in evals) == (evaluator == "hook")
            for s in evals:  # exactly one version per eval sample, the round's, while training went on around it
                assert set(sampled_versions(s)) == {r.weight_version}, (r.step, s.weight_versions)
        for step in range(4):  # every trained sample within its staleness bound of the trainer's version (= step)
            for s in store.read_step_samples("run", step):
                assert min(sampled_versions(s)) >= step - max_staleness, (step, s.weight_versions)
        train_versions = {s.metadata["weight_version"] for _, s in store.iter_samples("run")}
    assert len(train_versions) > 1  # the pool trained across versions meanwhile

    by_step = {m["step"]: m for m in read_metrics(tmp_path / "run")}
    assert by_step[0]["eval/heldout/samples"] == 16 and by_step[2]["eval_weight_version"] == 2
    during = [(k, s) for k in (0, 2) for s in (k, k + 1)
              if by_step[s].get("sync_held") and by_step[s]["finished_at"] < by_step[k]["eval_finished_at"]]
    assert during, "no step trained while a round was evaluating"  # the trainer went on beside the round
    assert re.search(r"eval [\d.]+ s in 3 round\(s\) beside [\d.]+ s of steps, \d step\(s\) trained while a round "
                     "sampled", result.stdout), result.stdout[-2000:]
    await replay_training_history(tmp_path / "run", "run")
