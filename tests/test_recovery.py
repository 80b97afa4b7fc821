"""Crashes are survivable: kill -9 a worker mid-run, and the run finishes with every sample
trained exactly once (the supervisor of `vime train` restarts the dead worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import engine_flags
from vime.store import SampleStore

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parent.parent
STEPS, GROUPS, N = 6, 2, 4


def start_run(tmp_path: Path, server, model: Path) -> tuple[subprocess.Popen, Path]:
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"count to {i}", "label": "1"}) + "\n" for i in range(8)))
    run_dir = tmp_path / "run"
    argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--input-key", "prompt", "--label-key", "label", "--rm-type", "exact_match",
            "--rollout-batch-size", str(GROUPS), "--n-samples-per-prompt", str(N), "--num-rollout", str(STEPS),
            "--rollout-max-response-len", "8", "--lr", "1e-4", "--run-dir", str(run_dir),
            "--save", str(tmp_path / "ckpt"), "--save-interval", "2", "--heartbeat-timeout", "6",
            *engine_flags(server)]
    env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}
    log = open(tmp_path / "driver.log", "w")
    return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=env), run_dir


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def steps_done(tmp_path: Path) -> int:
    text = (tmp_path / "driver.log").read_text()
    return max([int(line.split("step ")[1].split("/")[0]) for line in text.splitlines() if "] step " in line] or [0])


def worker_pid(run_dir: Path, module: str) -> int:
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if module.encode() in cmd and str(run_dir).encode() in cmd:
            return int(proc.name)
    raise AssertionError(f"no {module} process for {run_dir}")


def assert_trained_exactly_once(run_dir: Path) -> None:
    """Each step trained GROUPS x N samples, and every stored sample belongs to exactly one step.

    The store refuses to mark a sample trained at a second step, so a duplicate would have
    failed the run; a sample generated twice would show up as extra rows here.
    """
    with SampleStore.open(run_dir) as store:
        assert store.count_samples("run") == STEPS * GROUPS * N
        assert store.count_samples("run", untrained=True) == 0
        with store.engine.connect() as conn:
            rows = conn.exec_driver_sql("SELECT trained_step, COUNT(*) FROM samples GROUP BY trained_step").all()
    assert dict(rows) == {step: GROUPS * N for step in range(STEPS)}


@pytest.mark.parametrize("victim", ["workers.trainer", "workers.rollout"])
def test_kill_9_a_worker_mid_run_and_the_run_finishes_with_each_sample_trained_once(
        victim, training_server, tiny_model_dir, tmp_path):
    driver, run_dir = start_run(tmp_path, training_server, tiny_model_dir)
    try:
        wait_for(lambda: steps_done(tmp_path) >= 3 or driver.poll() is not None, 600, "step 3")
        time.sleep(0.3)  # land the kill anywhere in step 4: rollout, train, sync or checkpoint
        assert driver.poll() is None, (tmp_path / "driver.log").read_text()[-3000:]
        os.kill(worker_pid(run_dir, victim), signal.SIGKILL)
        assert driver.wait(timeout=900) == 0, (tmp_path / "driver.log").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    log = (tmp_path / "driver.log").read_text()
    assert f"worker {victim.split('.')[1]} died; restarted it" in log
    assert f"finished: {STEPS} steps" in log
    assert_trained_exactly_once(run_dir)
    if victim == "workers.trainer":  # the workflow noticed, picked the restarted trainer and re-attached it
        assert "re-attaching" in (run_dir / "worker-rollout.log").read_text()
