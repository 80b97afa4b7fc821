"""Ways to run `vime train`: a whole-step rollout function, a staleness bound, resuming with --load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent

ROLLOUT_FUNCTION = '''
from vime.rollout.vllm_rollout import generate_rollout as default

CALLS = []

async def generate_rollout(args, rollout_id, data_source, evaluation=False):
    """A slime-style rollout function: it owns the whole step."""
    groups = await default(args, rollout_id, data_source, evaluation)
    for group in groups:
        for sample in group:
            sample.metadata["by"] = "custom rollout function"
    return groups
'''


def train(tmp_path: Path, server, model: Path, *extra: str, run: str = "run", steps: int = 3) -> str:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"say {i}", "label": "1"}) + "\n" for i in range(8)))
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--input-key", "prompt", "--label-key", "label", "--rm-type", "exact_match", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "2", "--num-rollout", str(steps), "--rollout-max-response-len", "6",
            "--run-dir", str(tmp_path / run), *engine_flags(server), *extra]
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING",
           "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def trained_steps(run_dir: Path, run_id: str) -> dict:
    with SampleStore.open(run_dir) as store:
        with store.engine.connect() as conn:
            return dict(conn.exec_driver_sql(
                "SELECT trained_step, COUNT(*) FROM samples WHERE run_id = ? GROUP BY trained_step", (run_id,)).all())


def test_a_rollout_function_path_runs_each_step_as_one_activity(training_server, tiny_model_dir, tmp_path):
    (tmp_path / "my_rollout.py").write_text(ROLLOUT_FUNCTION)
    out = train(tmp_path, training_server, tiny_model_dir, "--rollout-function-path", "my_rollout.generate_rollout")
    assert "finished: 3 steps" in out
    assert trained_steps(tmp_path / "run", "run") == {0: 4, 1: 4, 2: 4}
    with SampleStore.open(tmp_path / "run") as store:
        assert all(s.metadata["by"] == "custom rollout function" for _, s in store.iter_samples("run"))


def test_with_max_staleness_1_rollouts_run_one_step_ahead_and_every_step_trains(training_server, tiny_model_dir,
                                                                             tmp_path):
    out = train(tmp_path, training_server, tiny_model_dir, "--max-staleness", "1", steps=4)
    assert "finished: 4 steps" in out
    assert trained_steps(tmp_path / "run", "run") == {0: 4, 1: 4, 2: 4, 3: 4}
    with SampleStore.open(tmp_path / "run") as store:
        versions = {s.metadata["weight_version"] for _, s in store.iter_samples("run")}
    assert len(versions) > 1  # later steps were sampled by newer weights


def test_load_resumes_a_new_run_at_the_checkpoint_step_and_data_position(training_server, tiny_model_dir, tmp_path):
    ckpt = str(tmp_path / "ckpt")
    train(tmp_path, training_server, tiny_model_dir, "--save", ckpt, "--save-interval", "2", steps=2, run="first")
    out = train(tmp_path, training_server, tiny_model_dir, "--load", ckpt, "--save", ckpt, steps=4, run="second")
    assert "resuming from" in out and "finished: 4 steps" in out
    assert trained_steps(tmp_path / "second", "second") == {2: 4, 3: 4}
    with SampleStore.open(tmp_path / "second") as store:
        groups = sorted({s.group_index for _, s in store.iter_samples("second")})
    assert groups == [4, 5, 6, 7]  # the prompts after the ones the first run consumed
