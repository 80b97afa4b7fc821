"""The quickstart learns: through Temporal, vLLM, the trainer and a weight sync per step, the
tiny model goes from ~0.23 mean reward (chance) to >= 0.9 within 10 minutes on 2 CPU cores.

The bar is 0.9 averaged over the last 3 of 24 steps; the figures measured here are in the
issue's closing note (0.22 at step 1, 0.91 at step 12, 1.00 from step 18 in one run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from vime.metrics_log import read_metrics

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent


def test_the_quickstart_raises_mean_reward_to_0_9_within_10_minutes(training_server, tmp_path):
    run_dir = tmp_path / "quickstart"
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    t0 = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "examples.quickstart.run", "--run-dir", str(run_dir),
                             *engine_flags(training_server)],
                            capture_output=True, text=True, cwd=REPO, env=env, timeout=600)
    elapsed = time.monotonic() - t0
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = (run_dir / "summary.txt").read_text()
    first = float(summary.split("mean reward ")[1].split(" ")[0])
    last = float(summary.split("-> ")[1].split(" ")[0])
    assert first < 0.5, summary
    assert last >= 0.9, summary
    assert elapsed < 600
    assert (run_dir / "reward_curve.png").stat().st_size > 1000
    assert (run_dir / "temporal.db").exists()  # the histories stay browsable
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == "step_000024"
    assert result.stdout.count("] step ") == 24

    # after it ended, from its directory alone: the run, its samples, one rollout
    (tmp_path / "hooks").mkdir()
    (tmp_path / "hooks" / "shorter_is_better.py").write_text(
        "async def rm(args, sample):\n    return 1.0 / (1 + sample.response_length)\n")
    hooks_env = {**env, "PYTHONPATH": str(tmp_path / "hooks")}

    def vime(*argv: str) -> str:
        done = subprocess.run([sys.executable, "-m", "vime.cli", *argv, "--run-dir", str(run_dir)],
                              capture_output=True, text=True, cwd=REPO, env=hooks_env, timeout=300)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "finished" in vime("runs").splitlines()[1]
    listed = json.loads(vime("samples", "quickstart", "--step", "23", "--json"))
    assert listed["total"] == 64 and all(s["step"] == 23 for s in listed["samples"])
    (shown,) = json.loads(vime("show", "quickstart", listed["samples"][0]["key"], "--json"))
    assert shown["prompt"] and shown["response_tokens"] and shown["trained_step"] == 23
    assert [m["step"] for m in read_metrics(run_dir)] == list(range(24)), "metrics.jsonl: one line per step"
    assert "(24 steps, " in vime("report", "quickstart")
    assert 'aria-label="Mean reward"' in (run_dir / "report.html").read_text()
    before = vime("samples", "quickstart", "--json", "--limit", "0")
    rescored = json.loads(vime("rescore", "quickstart", "--custom-rm-path", "shorter_is_better.rm", "--json"))
    assert rescored["written"] == rescored["samples"] == json.loads(before)["total"] and len(rescored["steps"]) == 24
    assert vime("samples", "quickstart", "--json", "--limit", "0") == before, "rescore changes no stored sample"
    again = json.loads(vime("rescore", "quickstart", "--custom-rm-path", "shorter_is_better.rm", "--json"))
    assert again["written"] == 0 and again["steps"] == rescored["steps"], "the same code again: a no-op"
