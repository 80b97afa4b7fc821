"""examples/coding_agent_rl end to end on CPU: synthetic traces, `vime sft`, then RL steps of
CodingAgentRolloutWorkflows through Temporal, with rewards above zero and every rollout's
history found by `temporal workflow list --query "RolloutStatus='completed'"`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
STEPS, PROMPTS, N = 2, 2, 4


def test_sft_warm_start_then_rl_steps_show_rewards_and_searchable_rollouts(training_server, tmp_path, sandbox_base):
    """On the suite's training server: the run syncs its warm-started weights into it on attach."""
    from tests.conftest import engine_flags

    run_dir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "examples.coding_agent_rl.run", "--tasks", "2", "--run-dir", str(run_dir),
         "--num-rollout", str(STEPS), *engine_flags(training_server)],
        cwd=REPO, env={**os.environ, "VIME_LOG_LEVEL": "WARNING", "TMPDIR": str(sandbox_base)},
        capture_output=True, text=True, timeout=1200)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]

    assert "warm start:" in out  # SFT on the traces, built here or found in the cache
    step_lines = [line for line in out.splitlines() if "] step " in line and "| reward " in line]
    assert len(step_lines) == STEPS  # a line per RL step, with its mean reward
    summary = (run_dir / "summary.txt").read_text()
    rewards = [float(r) for r in summary.split("mean reward per step")[1].split()]
    assert len(rewards) == STEPS and max(rewards) > 0, summary  # the warm start makes rewards non-zero

    listed = [line for line in out.splitlines() if "CodingAgentRolloutWorkflow" in line]
    assert len(listed) == STEPS * PROMPTS * N and all(line.split()[0] == "Completed" for line in listed)

    with SampleStore.open(run_dir) as store:
        outcomes = [s.metadata["grade"]["outcome"] for _, s in store.iter_samples(run_dir.name)
                    if s.metadata.get("segment_kind") == "final"]
        assert store.count_samples(run_dir.name, untrained=True) == 0  # every stored rollout was trained
    assert len(outcomes) == STEPS * PROMPTS * N and "passed" in outcomes
    assert not list(sandbox_base.glob("vime-sbx-*"))  # no sandbox left behind
