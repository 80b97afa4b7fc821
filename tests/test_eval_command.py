"""`vime eval` on the shared training server: a run's checkpoints and an HF checkpoint evaluated
through the durable eval rounds, a table printed, each eval sample stored once; the same command
again finds the finished eval; kill -9 of the rollout worker and Ctrl-C mid-eval, then the same
command, finish with each eval sample once (the store checked)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from tests.runs import REPO, TrainRun
from vime.rollout.policy_check import sampled_versions
from vime.store import SampleStore

pytestmark = pytest.mark.vllm


def write_heldout(path: Path, count: int) -> Path:
    path.write_text("".join(json.dumps({"q": f"count {i}", "a": "1"}) + "\n" for i in range(count)))
    return path


@pytest.fixture(scope="module")
def trained(training_server, tiny_model_dir, tmp_path_factory) -> TrainRun:
    """A 2-step run with a checkpoint after each step."""
    run = TrainRun(tmp_path_factory.mktemp("eval-src"), tiny_model_dir, *engine_flags(training_server),
                   "--save-interval", "1", steps=2, groups=2, n=2)
    try:
        assert run.run_to_end(timeout=600) == 0, run.tail()
    finally:
        run.kill_all()
    assert sorted(p.name for p in (run.tmp_path / "ckpt").glob("step_*")) == ["step_000001", "step_000002"]
    return run


def eval_argv(*flags: str) -> list[str]:
    return [sys.executable, "-m", "vime.cli", "eval", *flags]


def assert_each_eval_sample_once(run_dir: Path, rounds: dict[int, int], per_round: int) -> None:
    """The eval run's store holds the rounds {step: policy version} once each, and each round
    `per_round` eval samples, each once, each sampled by exactly the round's version."""
    with SampleStore.open(run_dir) as store:
        with store.engine.connect() as conn:
            (run_id,) = [r for (r,) in conn.exec_driver_sql("SELECT run_id FROM runs").all()]
        recorded = store.eval_rounds(run_id)
        assert {r.step: r.weight_version for r in recorded} == rounds
        for r in recorded:
            samples = [s for _, s in store.iter_samples(run_id, evaluation=True, eval_step=r.step)]
            assert len(samples) == per_round == r.metrics["eval/heldout/samples"]
            assert all(set(sampled_versions(s)) == {r.weight_version} for s in samples), r.step
        with store.engine.connect() as conn:
            twice = conn.exec_driver_sql("SELECT eval_step, rollout_id, sibling, COUNT(*) FROM samples WHERE run_id = ? "
                                         "GROUP BY eval_step, rollout_id, sibling HAVING COUNT(*) > 1",
                                         (run_id,)).all()
            total = conn.exec_driver_sql("SELECT COUNT(*) FROM samples WHERE run_id = ?", (run_id,)).scalar()
        assert twice == [] and total == per_round * len(rounds)


def test_vime_eval_of_a_runs_checkpoints_prints_the_table_and_stores_each_sample_once(
        trained, training_server, tmp_path):
    heldout = write_heldout(tmp_path / "heldout.jsonl", 3)
    argv = eval_argv(str(trained.run_dir), "--checkpoints", "all", "--eval-prompt-data", "heldout", str(heldout),
                     "--eval-input-key", "q", "--eval-label-key", "a", "--n-samples-per-eval-prompt", "2",
                     "--eval-max-response-len", "4", *engine_flags(training_server))
    first = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=trained.env, timeout=600)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    (eval_dir,) = (trained.run_dir / "evals").iterdir()
    rows = [line.split() for line in first.stdout.splitlines() if line.startswith("step_0000")]
    assert [(r[0], r[1], r[2]) for r in rows] == [("step_000001", "1", "heldout"), ("step_000002", "2", "heldout")]
    assert "[eval] step_000001 | eval heldout" in first.stdout
    assert_each_eval_sample_once(eval_dir, {1: 1, 2: 2}, per_round=6)

    again = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=trained.env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "already finished" in again.stdout
    assert [line.split()[:3] for line in again.stdout.splitlines() if line.startswith("step_0000")] == \
        [r[:3] for r in rows]
    assert [p.name for p in (trained.run_dir / "evals").iterdir()] == [eval_dir.name]  # the same eval run
    assert_each_eval_sample_once(eval_dir, {1: 1, 2: 2}, per_round=6)


SET_HOOKS = '''
from vime.rollout.generate import generate as vime_generate


async def generate(args, sample, sampling_params, evaluation=False):
    """The easy set's own generate function: vime's, noting the sampling it was given."""
    sample = await vime_generate(args, sample, sampling_params, evaluation)
    sample.metadata.update(by="the set's generate", temperature=sampling_params["temperature"],
                           max_tokens=sampling_params["max_tokens"])
    return sample


def full_marks(args, sample):
    return 1.0
'''

EVAL_CONFIG = """
eval:
  defaults: {{input_key: q, label_key: a, max_response_len: 4}}
  datasets:
    - {{name: heldout, path: {heldout}, rm_type: exact_match, n_samples_per_eval_prompt: 4}}
    - name: easy
      path: {easy}
      n_samples_per_eval_prompt: 2
      custom_rm_path: set_hooks.full_marks
      custom_generate_function_path: set_hooks.generate
      temperature: 0.5
      max_response_len: 3
"""


def test_vime_eval_of_an_hf_checkpoint_on_an_eval_config_gives_each_set_its_own_samples_and_reward(
        training_server, tiny_model_dir, tmp_path):
    """Two sets of one --eval-config in one round: each with its own samples per prompt (so its own
    pass@k), sampling, generate function and reward function."""
    (tmp_path / "set_hooks.py").write_text(SET_HOOKS)
    config = tmp_path / "eval.yaml"
    config.write_text(EVAL_CONFIG.format(heldout=write_heldout(tmp_path / "heldout.jsonl", 2),
                                         easy=write_heldout(tmp_path / "easy.jsonl", 3)))
    argv = eval_argv("--hf-checkpoint", str(tiny_model_dir), "--eval-config", str(config),
                     "--run-dir", str(tmp_path / "ev"), *engine_flags(training_server))
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = {line.split()[2]: line for line in out.stdout.splitlines() if line.startswith(tiny_model_dir.name)}
    assert set(rows) == {"heldout", "easy"} and "(k=4)" in rows["heldout"] and "(k=2)" in rows["easy"], out.stdout

    with SampleStore.open(tmp_path / "ev") as store, store.engine.connect() as conn:
        (run_id,) = [r for (r,) in conn.exec_driver_sql("SELECT run_id FROM runs").all()]
    with SampleStore.open(tmp_path / "ev") as store:
        (recorded,) = store.eval_rounds(run_id)
        by_set: dict[str, list] = {}
        for _, s in store.iter_samples(run_id, evaluation=True, eval_step=0):
            by_set.setdefault(s.metadata["eval_set"], []).append(s)
    m = recorded.metrics
    assert (m["eval/heldout/samples"], m["eval/easy/samples"]) == (2 * 4, 3 * 2)
    assert "eval/heldout/pass@4" in m and "eval/easy/pass@2" in m and "eval/easy/pass@4" not in m
    assert m["eval/easy/reward_mean"] == m["eval/easy/pass@1"] == m["eval/easy/pass@2"] == 1.0  # its own reward
    heldout, easy = by_set["heldout"], by_set["easy"]
    assert len(heldout) == 8 and len(easy) == 6
    assert all(s.reward in (0.0, 1.0) and "by" not in s.metadata and s.response_length <= 4 for s in heldout)
    assert all(s.metadata["rm_type"] == "exact_match" for s in heldout)
    assert all(s.reward == 1.0 and s.metadata["by"] == "the set's generate" for s in easy)
    assert all(s.metadata["temperature"] == 0.5 and s.metadata["max_tokens"] == 3 and s.response_length <= 3
               for s in easy)
    assert all(set(sampled_versions(s)) == {0} for s in heldout + easy)


def test_kill_9_of_the_rollout_worker_and_ctrl_c_mid_eval_then_the_same_command_finishes_once(
        trained, training_server, tiny_model_dir, tmp_path):
    heldout = write_heldout(tmp_path / "heldout.jsonl", 24)
    ev = TrainRun(tmp_path, tiny_model_dir, run="ev")
    ev.argv = eval_argv(str(trained.run_dir), "--eval-prompt-data", "heldout", str(heldout), "--eval-input-key", "q",
                        "--eval-label-key", "a", "--n-samples-per-eval-prompt", "2", "--eval-max-response-len", "12",
                        "--run-dir", str(ev.run_dir), *engine_flags(training_server))

    def evals_stored() -> int:
        if not (ev.run_dir / "vime.db").exists():
            return 0
        with SampleStore.open(ev.run_dir) as store, store.engine.connect() as conn:
            return conn.exec_driver_sql("SELECT COUNT(*) FROM samples WHERE eval_step IS NOT NULL").scalar()

    try:
        ev.start()
        ev.wait_for(lambda: evals_stored() >= 4, 300, "the first eval samples")
        worker = ev.pid("rollout")
        os.kill(worker, signal.SIGKILL)
        ev.wait_for(lambda: "worker rollout died" in ev.output(1), 60, "the launcher to see the worker die")
        ev.wait_for(lambda: evals_stored() >= 48 + 4, 300, "the second checkpoint's round to start")
        assert ev.stop(signal.SIGINT) == 130, ev.tail()
        assert "resume with:" in ev.output(1)
        ev.assert_nothing_left(60)
        assert ev.run_to_end(timeout=600) == 0, ev.tail()
    finally:
        ev.kill_all()
    out = ev.output(2)
    assert "is in progress; continuing it" in out, out[-3000:]
    assert_each_eval_sample_once(ev.run_dir, {1: 1, 2: 2}, per_round=48)


def test_kill_9_of_the_vllm_server_vime_eval_started_mid_round_reloads_the_checkpoint(
        trained, tiny_model_dir, tmp_path):
    """A server the launcher restarts boots the base model: the checkpoint under evaluation is
    loaded into it again, and the round's samples all carry the checkpoint's version."""
    heldout = write_heldout(tmp_path / "heldout.jsonl", 200)  # more groups than run at once: some meet the kill
    ev = TrainRun(tmp_path, tiny_model_dir, run="ev")
    ev.argv = eval_argv(str(trained.run_dir), "--checkpoints", "last", "--eval-prompt-data", "heldout", str(heldout),
                        "--eval-input-key", "q", "--eval-label-key", "a", "--n-samples-per-eval-prompt", "2",
                        "--eval-max-response-len", "12", "--run-dir", str(ev.run_dir))  # vime starts the server

    def evals_stored() -> int:
        if not (ev.run_dir / "vime.db").exists():
            return 0
        with SampleStore.open(ev.run_dir) as store, store.engine.connect() as conn:
            return conn.exec_driver_sql("SELECT COUNT(*) FROM samples WHERE eval_step IS NOT NULL").scalar()

    try:
        ev.start()
        ev.wait_for(lambda: evals_stored() >= 4, 600, "the first eval samples")
        os.kill(ev.pid("vllm"), signal.SIGKILL)
        assert ev.wait(900) == 0, ev.tail()
    finally:
        ev.kill_all()
    out = ev.output(1)
    assert "loading the checkpoint under evaluation into the restarted server" in out, out[-3000:]
    assert_each_eval_sample_once(ev.run_dir, {2: 2}, per_round=400)
