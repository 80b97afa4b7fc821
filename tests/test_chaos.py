"""Chaos drills: real processes, real faults, on short quickstart-shaped runs.

After every fault the run completes, every step trained exactly `groups x n` samples, each
once, steps contiguous, and nothing of the run is left running. Each drill prints its recovery
time: from the fault to the next step that finished.

- `test_a_run_survives_each_of_its_parts_dying`: one run that `vime train` starts whole (its own
  Temporal dev server and vLLM server) and that meets, in turn: kill -9 of the vLLM server, of
  the Temporal dev server, of the rollout worker, of the trainer worker; SIGSTOP of the vLLM
  server for 60 s; an exclusive lock on its store for 45 s.
- `test_kill_9_of_the_launcher_then_ctrl_c_three_times_and_the_run_resumes_each_time`: the
  launcher itself killed with SIGKILL (nothing of it survives; the rerun goes on), then Ctrl-C and
  rerun three times.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import pytest

from tests.conftest import engine_flags
from tests.runs import STEP_LINE, TrainRun

pytestmark = pytest.mark.vllm

STEP_TIMEOUT = 600


def report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[chaos] {line}", flush=True)


def drill(run: TrainRun, capsys, what: str, fault, *, at_step: int) -> None:
    """Wait for `at_step`, apply `fault` (a kill, or a stop it lifts itself), and report the seconds
    from the fault's end to the next finished step: the recovery time."""
    run.wait_for_step(at_step, STEP_TIMEOUT)
    fault()
    t0, done = time.monotonic(), run.steps_done()
    run.wait_for_step(done + 1, STEP_TIMEOUT)
    report(capsys, f"{what} after step {done}: the next step finished {time.monotonic() - t0:.1f} s after "
                   "the fault ended")


def kill9(run: TrainRun, kind: str):
    return lambda: os.kill(run.pid(kind), signal.SIGKILL)


def sigstop(run: TrainRun, seconds: float):
    def fault() -> None:
        pid = run.pid("vllm")
        os.kill(pid, signal.SIGSTOP)
        time.sleep(seconds)
        os.kill(pid, signal.SIGCONT)
    return fault


def lock_store(run: TrainRun, seconds: float):
    def fault() -> None:
        conn = sqlite3.connect(run.run_dir / "vime.db", timeout=60, isolation_level=None)
        conn.execute("BEGIN EXCLUSIVE")
        done = threading.Event()
        threading.Timer(seconds, done.set).start()
        done.wait()
        conn.execute("ROLLBACK")
        conn.close()
    return fault


def test_a_run_survives_each_of_its_parts_dying(tiny_model_dir, tmp_path, capsys):
    run = TrainRun(tmp_path, tiny_model_dir, "--vllm-max-model-len", "512", steps=14)
    run.start()
    try:
        drill(run, capsys, "kill -9 of the vLLM server", kill9(run, "vllm"), at_step=2)
        drill(run, capsys, "kill -9 of the Temporal dev server", kill9(run, "temporal"), at_step=4)
        drill(run, capsys, "kill -9 of the rollout worker", kill9(run, "rollout"), at_step=6)
        drill(run, capsys, "kill -9 of the trainer worker", kill9(run, "trainer"), at_step=8)
        drill(run, capsys, "SIGSTOP of the vLLM server for 60 s", sigstop(run, 60), at_step=10)
        drill(run, capsys, "an exclusive lock on the store for 45 s", lock_store(run, 45), at_step=12)
        assert run.wait(STEP_TIMEOUT) == 0, run.tail()
        out = run.output()
        assert "vLLM server 0" in out and "is back" in out
        assert "Temporal dev server died" in out
        assert "worker rollout died" in out and "worker trainer died" in out
        assert f"finished: {run.steps} steps" in out
        run.assert_trained_exactly_once()
        run.assert_nothing_left()
    finally:
        run.kill_all()


def test_kill_9_of_the_launcher_then_ctrl_c_three_times_and_the_run_resumes_each_time(
        training_server, tiny_model_dir, tmp_path, capsys):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), steps=10)
    try:
        run.start()
        run.wait_for_step(2, STEP_TIMEOUT)
        run.process.kill()
        run.process.wait()
        gone = run.wait_for_nothing_left(30)
        report(capsys, f"kill -9 of the launcher after step 2: every process of the run gone {gone:.1f} s later")
        for stop_at in (4, 6, 8):
            t0 = time.monotonic()
            run.start()
            took = run.wait_for(lambda: STEP_LINE.search(run.output(run.launches)), STEP_TIMEOUT, "a step")
            report(capsys, f"rerun {run.launches - 1}: its first step finished {took:.1f} s after the command")
            run.wait_for_step(stop_at, STEP_TIMEOUT)
            assert run.stop(signal.SIGINT) == 130, run.tail()
            stopped = run.output(run.launches)
            assert "resume with:" in stopped and "Traceback" not in stopped, stopped[-3000:]
            run.assert_nothing_left()
            report(capsys, f"Ctrl-C after step {stop_at}: stopped cleanly {time.monotonic() - t0:.1f} s into "
                           "the launch")
        assert run.run_to_end(STEP_TIMEOUT) == 0, run.tail()
        last = run.output(run.launches)
        trained_now = int(last.split(" trained by this launch")[0].rsplit(", ", 1)[1])
        assert 0 < trained_now < run.steps  # the rerun reports what it trained, not the whole run
        run.assert_trained_exactly_once()
        run.assert_nothing_left()
    finally:
        run.kill_all()
