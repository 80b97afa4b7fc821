"""Rollouts in a lower precision than the trainer: seen from the flags, corrected by default.

A bfloat16 (or fp8) rollout server samples with logprobs that are not the float32 trainer's even
for the same weights; with nothing said about TIS or MIS, vime turns truncated importance
sampling on for such a run and says why. bench/low_precision.py measures the gap.
"""

from __future__ import annotations

import pytest

from vime.config.args import parse_args
from vime.config.precision import Precisions, precisions

TRAINING = ["--rollout-batch-size", "2", "--num-rollout", "3", "--n-samples-per-prompt", "2"]


def test_the_rollout_precision_is_read_from_the_server_flags():
    assert precisions([], cpu=True) == Precisions("float32", "float32")  # vime's CPU default: no gap
    assert precisions(["--dtype", "bfloat16"], cpu=True) == Precisions("bfloat16", "float32")
    assert precisions(["--dtype=bf16"], cpu=True).rollout == "bfloat16"
    assert precisions(["--dtype", "bfloat16", "--dtype", "float32"], cpu=True).differ is False  # the last wins
    assert precisions(["--quantization", "fp8"], cpu=False) == Precisions("fp8 (quantization)", "bfloat16")
    assert precisions([], cpu=False).differ is False  # GPU: the checkpoint's dtype ("auto") next to a bf16 trainer


def test_bf16_rollouts_turn_tis_on_unless_the_command_line_says_otherwise(monkeypatch):
    monkeypatch.setattr("vime.engine.server.is_cpu_build", lambda: True)
    on = parse_args([*TRAINING, "--vllm-dtype", "bfloat16"])
    assert on.use_tis and not on.use_mis
    assert on.tis_because.startswith("rollouts sample in bfloat16, the trainer computes in float32: --use-tis is on")
    assert not parse_args([*TRAINING, "--vllm-dtype", "bfloat16", "--no-use-tis"]).use_tis
    mis = parse_args([*TRAINING, "--vllm-dtype", "bfloat16", "--use-mis"])
    assert mis.use_mis and not mis.use_tis  # the user chose a correction: vime adds none
    same = parse_args(TRAINING)
    assert not same.use_tis and same.tis_because == ""
    assert parse_args([*TRAINING, "--use-tis"]).use_tis


def test_a_server_group_in_bf16_counts_too(tmp_path, monkeypatch):
    monkeypatch.setattr("vime.engine.server.is_cpu_build", lambda: True)
    path = tmp_path / "serving.yaml"
    path.write_text("vllm:\n  - name: actor\n    server_groups:\n      - worker_type: regular\n        num_gpus: 1\n"
                    "        overrides: {dtype: bfloat16}\n")
    args = parse_args([*TRAINING, "--hf-checkpoint", str(tmp_path), "--vllm-config", str(path)])
    assert args.use_tis and "bfloat16" in args.tis_because


def test_a_script_that_only_generates_gets_no_correction(monkeypatch):
    monkeypatch.setattr("vime.engine.server.is_cpu_build", lambda: True)
    assert not parse_args(["--vllm-dtype", "bfloat16"]).use_tis


@pytest.mark.parametrize("argv", [["--no-use-tis"], []])
def test_slime_scripts_keep_use_tis_off_by_default(argv):
    assert parse_args(argv).use_tis is False


@pytest.mark.vllm
def test_the_quickstart_with_bf16_rollouts_reaches_its_reward_with_tis_on(tmp_path):
    """bf16 rollout servers against the float32 trainer: TIS comes on by itself, every weight sync
    passes its (precision-aware) check, and the quickstart still reaches a mean reward of 0.9."""
    import os
    import subprocess
    import sys

    from tests.runs import REPO

    run_dir = tmp_path / "quickstart-bf16"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    result = subprocess.run([sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir),
                             "--vllm-dtype", "bfloat16"], capture_output=True, text=True, cwd=REPO, env=env,
                            timeout=900)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "rollouts sample in bfloat16, the trainer computes in float32: --use-tis is on" in result.stdout
    summary = (run_dir / "summary.txt").read_text()
    assert float(summary.split("-> ")[1].split(" ")[0]) >= 0.9, summary
    assert "'dtype': 'bfloat16'" in (run_dir / "vllm-0.log").read_text()


@pytest.mark.vllm
def test_the_precision_benchmark_prints_the_gap_per_rollout_dtype():
    import subprocess
    import sys

    from tests.runs import REPO

    result = subprocess.run([sys.executable, "bench/low_precision.py", "--dtypes", "bfloat16", "--requests", "2",
                             "--max-tokens", "8"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    (row,) = [line.split() for line in result.stdout.splitlines() if line.startswith("bfloat16")]
    assert row[1] == "16" and 0 < float(row[2]) < 0.1  # 16 tokens; bf16 is off the fp32 trainer, by little
