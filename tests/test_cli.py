"""The `vime` command: the smoke run works, and bad inputs end with one clear line and exit code 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def vime(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    return subprocess.run([sys.executable, "-m", "vime.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env=env)


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return errors[0]


@pytest.mark.vllm
def test_smoke_samples_from_the_model_through_a_workflow(vllm_server, tiny_model_dir, tmp_path):
    result = vime("smoke", "--hf-checkpoint", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"),
                  "--vllm-router-ip", "127.0.0.1", "--vllm-router-port", str(vllm_server.port),
                  "--rollout-max-response-len", "8")
    assert result.returncode == 0, result.stderr
    assert "Web UI http://127.0.0.1:" in result.stdout
    assert result.stdout.count("tokens sampled") == 3
    assert "[smoke] ok" in result.stdout
    assert (tmp_path / "run" / "temporal.db").exists()


def test_an_unknown_flag_is_named_with_a_suggestion():
    line = one_error_line(vime("smoke", "--rollout-bach-size", "3"))
    assert "--rollout-bach-size" in line and "--rollout-batch-size" in line


def test_a_malformed_vllm_flag_fails_at_parse_time_naming_it():
    line = one_error_line(vime("smoke", "--vllm-max-model-len", "abc"))
    assert "--vllm-max-model-len" in line and "abc" in line


def test_a_bad_plugin_path_fails_at_start_naming_path_and_module(tmp_path):
    line = one_error_line(vime("train", "--hf-checkpoint", str(tmp_path), "--prompt-data", "p.jsonl",
                               "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                               "--custom-rm-path", "no_such_pkg.rewards.score", "--run-dir", str(tmp_path / "r")))
    assert "--custom-rm-path" in line and "no_such_pkg.rewards.score" in line and "no_such_pkg" in line


def test_an_unreachable_temporal_address_is_one_line(tmp_path):
    line = one_error_line(vime("smoke", "--temporal-address", "127.0.0.1:1", "--hf-checkpoint", str(tmp_path),
                               "--run-dir", str(tmp_path / "run")))
    assert "cannot connect to Temporal at --temporal-address '127.0.0.1:1'" in line


@pytest.mark.vllm
def test_a_vllm_that_fails_to_start_is_reported_with_its_log(tmp_path):
    not_a_model = tmp_path / "empty-dir"
    not_a_model.mkdir()
    result = vime("smoke", "--hf-checkpoint", str(not_a_model), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "Traceback (most recent call last)" not in result.stderr.split("error:")[0]
    assert "vLLM server for" in result.stderr and "exited with code" in result.stderr
    assert str(tmp_path / "run" / "vllm.log") in result.stderr


def test_help_lists_the_flag_groups():
    result = vime("smoke", "--help")
    assert result.returncode == 0
    for group in ("data", "rollout", "training", "orchestration", "vLLM", "router"):
        assert group in result.stdout
    assert "--vllm-max-model-len" in result.stdout


def test_config_prints_the_workflow_input_that_temporal_decodes_as_the_run_s_numbers(tmp_path):
    from vime.config.run_input import from_json
    from vime.temporal.training_contract import TrainingState

    result = vime("config", "--hf-checkpoint", str(tmp_path), "--run-id", "exp1", "--rollout-batch-size", "2",
                  "--n-samples-per-prompt", "4", "--num-rollout", "3", "--max-staleness", "1",
                  "--trainer-task-queue", "gpu-a")
    assert result.returncode == 0, result.stderr
    got = from_json(result.stdout)  # stdout is the JSON alone: `vime config ... > run.json`
    assert (got.config.run_id, got.config.num_rollout, got.config.rollout_batch_size) == ("exp1", 3, 2)
    assert (got.config.n_samples_per_prompt, got.config.over_sampling_batch_size) == (4, 2)
    assert (got.config.max_staleness, got.config.trainer_task_queue) == (1, "gpu-a")
    assert got.state == TrainingState(), "a new run starts at step 0"


def test_config_with_a_bad_flag_is_one_line_and_no_json():
    result = vime("config", "--rollout-batch-size", "two")
    assert "--rollout-batch-size" in one_error_line(result)
    assert result.stdout == ""
