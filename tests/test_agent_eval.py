"""Evaluation through the agent environments, on the shared training server: the coding agent's
held-out tasks through `vime eval` (issue 23's acceptance), and an eval round inside a `vime train`
run of multi_agent and of tool_use. Each environment reads and stores through the SDK only; the
store shows every eval rollout stored once as its round's, each sample from exactly the round's
policy version, none trained, none in a step manifest, and the figures under `eval/<set>/...`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from vime.metrics_log import read_metrics
from vime.rollout.policy_check import sampled_versions
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
ENV = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}


def the_run_id(run_dir: Path) -> str:
    with SampleStore.open(run_dir) as store, store.engine.connect() as conn:
        (run_id,) = [r for (r,) in conn.exec_driver_sql("SELECT run_id FROM runs").all()]
    return run_id


def assert_eval_rollouts_stored_once(run_dir: Path, rounds: dict[int, int], rollouts: int,
                                     sizes: set[int] | None = None) -> dict:
    """The run's eval rounds are `rounds` ({step: policy version}); each holds `rollouts` eval
    rollouts (ids `eval<step>-heldout-<index>`, each of a size in `sizes` when given) stored once,
    every sample tagged with the set and sampled by exactly the round's version, none trained or
    in a manifest. Returns the recorded figures by step."""
    run_id = the_run_id(run_dir)
    with SampleStore.open(run_dir) as store:
        recorded = {r.step: r for r in store.eval_rounds(run_id)}
        assert {s: r.weight_version for s, r in recorded.items()} == rounds
        for step, r in recorded.items():
            stored = list(store.iter_samples(run_id, evaluation=True, eval_step=step))
            by_rollout: dict[str, list] = {}
            for ref, s in stored:
                by_rollout.setdefault(ref.rollout_id, []).append(s)
            assert len(by_rollout) == rollouts == r.metrics["eval/heldout/samples"], sorted(by_rollout)
            assert all(rid.startswith(f"eval{step}-heldout-") for rid in by_rollout)
            assert sizes is None or {len(siblings) for siblings in by_rollout.values()} <= sizes
            for _, s in stored:
                assert s.metadata["eval_set"] == "heldout" and s.metadata["weight_version"] == r.weight_version
                assert set(sampled_versions(s)) == {r.weight_version}, (step, s.weight_versions)
        with store.engine.connect() as conn:
            twice = conn.exec_driver_sql("SELECT rollout_id, sibling FROM samples WHERE run_id = ? GROUP BY "
                                         "rollout_id, sibling HAVING COUNT(*) > 1", (run_id,)).all()
            trained = conn.exec_driver_sql("SELECT COUNT(*) FROM samples WHERE run_id = ? AND eval_step IS NOT NULL "
                                           "AND trained_step IS NOT NULL", (run_id,)).scalar()
            manifests = [json.loads(ids) if isinstance(ids, str) else ids for (ids,) in
                         conn.exec_driver_sql("SELECT rollout_ids FROM step_manifests").all()]
        assert twice == [] and trained == 0
        assert not any(rid.startswith("eval") for ids in manifests for rid in ids)
        return {s: r.metrics for s, r in recorded.items()}


def test_vime_eval_runs_the_coding_agent_on_held_out_tasks_with_pass_at_k(training_server, tiny_model_dir, tmp_path,
                                                                           sandbox_base):
    from examples.coding_agent_rl.gold_edits import write_prompts
    from examples.coding_agent_rl.tasks.prepare import load_tasks

    heldout = write_prompts(load_tasks()[4:6], tmp_path / "heldout.jsonl")  # tasks the example never trains on
    argv = [sys.executable, "-m", "vime.cli", "eval", "--hf-checkpoint", str(tiny_model_dir),
            "--rollout-env", "coding_agent", "--sandbox-backend", "bwrap", "--agent-max-turns", "2",
            "--agent-max-tokens", "24", "--agent-command-timeout", "30", "--input-key", "prompt", "--label-key", "label",
            "--eval-prompt-data", "heldout", str(heldout), "--n-samples-per-eval-prompt", "2",
            "--run-dir", str(tmp_path / "ev"), *engine_flags(training_server)]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=600,
                         env={**ENV, "TMPDIR": str(sandbox_base)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    row = next(line.split() for line in out.stdout.splitlines() if line.startswith(tiny_model_dir.name))
    assert row[1:3] == ["0", "heldout"] and "(k=2)" in out.stdout

    figures = assert_eval_rollouts_stored_once(tmp_path / "ev", {0: 0}, rollouts=4)
    assert {"eval/heldout/pass@1", "eval/heldout/pass@2", "eval/heldout/reward_mean"} <= set(figures[0])
    with SampleStore.open(tmp_path / "ev") as store:
        finals = [s for _, s in store.iter_samples(the_run_id(tmp_path / "ev"), evaluation=True)
                  if s.metadata.get("segment_kind") == "final"]
    assert len(finals) == 4 and all(s.metadata["grade"]["outcome"] for s in finals)  # each graded in a sandbox
    assert {s.metadata["task_id"] for s in finals} == {t.task_id for t in load_tasks()[4:6]}
    assert not list(sandbox_base.glob("vime-sbx-*"))  # no sandbox left behind


def tool_use_prompts(path: Path, count: int) -> Path:
    from vime.envs.tool_use.task import problems, write_prompts

    return write_prompts(path, problems(count, seed=7))


def multi_agent_prompts(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"Name a city. ({i})"}) + "\n" for i in range(count)))
    return path


ENVS = {
    # env: (its flags, its prompt file, the samples a rollout may hold: a team's roles (the
    # solver alone when it drafted nothing usable), or the one multi-turn sample)
    "multi_agent": (["--num-solvers", "1"], multi_agent_prompts, {1, 3}),
    "tool_use": (["--label-key", "label", "--apply-chat-template", "--tool-max-turns", "2", "--tool-timeout", "5"],
                 tool_use_prompts, {1}),
}


@pytest.mark.parametrize("env", sorted(ENVS))
def test_an_eval_round_in_a_run_of_the_environment_stores_eval_samples_once_on_the_rounds_policy(
        env, training_server, tiny_model_dir, tmp_path, sandbox_base):
    flags, prompts, sizes = ENVS[env]
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(tiny_model_dir), "--rollout-env", env,
            *flags, "--prompt-data", str(prompts(tmp_path / "train.jsonl", 4)), "--input-key", "prompt",
            "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1",
            "--rollout-max-response-len", "12", "--run-dir", str(run_dir),
            "--eval-interval", "1", "--eval-prompt-data", "heldout", str(prompts(tmp_path / "heldout.jsonl", 2)),
            "--n-samples-per-eval-prompt", "2", "--eval-temperature", "0.7", *engine_flags(training_server)]
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env={**ENV, "TMPDIR": str(sandbox_base)},
                         timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "[eval] after step 1/1 | eval heldout" in out.stdout

    figures = assert_eval_rollouts_stored_once(run_dir, {0: 0, 1: 1}, rollouts=4, sizes=sizes)
    metrics = {m["step"]: m for m in read_metrics(run_dir)}
    for step in (0, 1):
        assert metrics[step]["eval/heldout/pass@2"] == figures[step]["eval/heldout/pass@2"]
        assert metrics[step]["eval_weight_version"] == step
    with SampleStore.open(run_dir) as store:
        training = {ref.rollout_id for ref, _ in store.iter_samples(the_run_id(run_dir))}
        assert training == {"0", "1"}  # the one step's two rollouts, under their plain ids
        assert store.count_samples(the_run_id(run_dir), untrained=True) == 0
