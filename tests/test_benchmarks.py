"""A benchmark that saw a failed rollout fails: no ratio from failed work. And with a working
engine it prints its figures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vime.engine.server import free_port

REPO = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "bench/orchestration_overhead.py", "--groups", "2", "--n", "2", "--max-tokens", "4",
         "--repeats", "1"]


def test_the_orchestration_benchmark_prints_no_ratio_when_rollouts_failed():
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: every rollout fails
    result = subprocess.run([*BENCH, "--vllm-url", dead], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert result.returncode == 1, result.stdout + result.stderr[-2000:]
    assert "ratio" not in result.stdout
    failure = [line for line in result.stderr.splitlines() if "FAILED" in line]
    assert failure and "rollouts failed" in failure[0] and "first error" in failure[0], result.stderr[-2000:]


@pytest.mark.vllm
def test_the_orchestration_benchmark_prints_its_ratio_on_a_working_engine(training_server):
    result = subprocess.run([*BENCH, "--vllm-url", training_server.url], capture_output=True, text=True, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    assert "throughput ratio (workflows / direct):" in result.stdout
