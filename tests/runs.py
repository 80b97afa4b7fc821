"""Driving `vime train` as a user does, for the tests that break it: start, watch, kill, check.

`TrainRun` launches `python -m vime.cli train ...` as a subprocess (its console goes to
`driver.log`, appended per launch), finds the processes the launch started (by their command
line and `VIME_RUN_DIR`), and checks the store afterwards: every step trained exactly
`groups x n` samples, each once, steps contiguous.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from vime.procs import kill_leftovers, leftover_processes
from vime.rollout.policy_check import sampled_versions
from vime.train.trainer_group import trainable
from vime.store import SampleStore

REPO = Path(__file__).resolve().parent.parent
STEP_LINE = re.compile(r"\] step (\d+)/(\d+) \|")

# what each kind of process has in its command line (the guard in front of each is left out)
PROCESS_MARKERS = {
    "vllm": "vllm.entrypoints.openai.api_server",
    "temporal": "start-dev",
    "rollout": "workers.rollout",
    "trainer": "workers.trainer",
}


def run_process(run_dir: Path, kind: str) -> int:
    """The pid of the `kind` process a command started for `run_dir` (not its guard)."""
    marker = PROCESS_MARKERS[kind].encode()
    for pid in leftover_processes(run_dir):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"vime.procguard" in cmd:
            continue
        if any(marker in part for part in cmd):
            return pid
    raise AssertionError(f"no {kind} process of {run_dir} is running")


def write_prompts(path: Path, count: int = 16) -> Path:
    path.write_text("".join(json.dumps({"prompt": f"count to {i}", "label": "1"}) + "\n" for i in range(count)))
    return path


class TrainRun:
    """One run directory, launched as many times as a test likes."""

    def __init__(self, tmp_path: Path, model: Path, *extra: str, steps: int = 6, groups: int = 2, n: int = 4,
                 run: str = "run", env: dict[str, str] | None = None) -> None:
        self.tmp_path = tmp_path
        self.run_dir = tmp_path / run
        self.run_id = run
        self.steps, self.groups, self.n = steps, groups, n
        tmp_path.mkdir(parents=True, exist_ok=True)
        prompts = write_prompts(tmp_path / "prompts.jsonl")
        self.argv = [sys.executable, "-m", "vime.cli", "train", "--hf-checkpoint", str(model),
                     "--prompt-data", str(prompts), "--input-key", "prompt", "--label-key", "label",
                     "--rm-type", "exact_match", "--rollout-batch-size", str(groups), "--n-samples-per-prompt", str(n),
                     "--num-rollout", str(steps), "--rollout-max-response-len", "8", "--lr", "1e-4",
                     "--run-dir", str(self.run_dir), "--save", str(tmp_path / "ckpt"), "--save-interval", "2",
                     *extra]
        self.env = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING",
                    "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", **(env or {})}
        self.log_path = tmp_path / "driver.log"
        self.process: subprocess.Popen | None = None
        self.launches = 0

    # ---- launching -------------------------------------------------------------------------

    def start(self) -> subprocess.Popen:
        self.launches += 1
        log = open(self.log_path, "a")
        log.write(f"\n===== launch {self.launches} =====\n")
        log.flush()
        self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=self.env)
        return self.process

    def run_to_end(self, timeout: float = 900) -> int:
        self.start()
        return self.wait(timeout)

    def wait(self, timeout: float = 900) -> int:
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise AssertionError(f"vime train did not finish in {timeout} s:\n{self.tail()}") from None

    def stop(self, sig: int = signal.SIGINT, timeout: float = 120) -> int:
        self.process.send_signal(sig)
        return self.wait(timeout)

    def kill_all(self) -> None:
        """Test teardown: nothing of this run survives a failed test."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
        kill_leftovers(self.run_dir, timeout=0)

    # ---- watching --------------------------------------------------------------------------

    def output(self, launch: int | None = None) -> str:
        text = self.log_path.read_text() if self.log_path.exists() else ""
        if launch is None:
            return text
        return text.split(f"===== launch {launch} =====", 1)[-1].split("===== launch", 1)[0]

    def tail(self, chars: int = 4000) -> str:
        return self.output()[-chars:]

    def steps_done(self) -> int:
        """The highest step any launch printed as finished."""
        return max((int(m.group(1)) for m in STEP_LINE.finditer(self.output())), default=0)

    def wait_for(self, predicate, timeout: float, what: str) -> float:
        """Wait until `predicate()`; returns the seconds it took. Fails if the launcher exits first."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if predicate():
                return time.monotonic() - t0
            if self.process is not None and self.process.poll() is not None:
                raise AssertionError(f"vime train exited ({self.process.returncode}) while waiting for {what}:\n"
                                     f"{self.tail()}")
            time.sleep(0.2)
        raise AssertionError(f"timed out after {timeout} s waiting for {what}:\n{self.tail()}")

    def wait_for_step(self, step: int, timeout: float = 600) -> float:
        return self.wait_for(lambda: self.steps_done() >= step, timeout, f"step {step}")

    def pid(self, kind: str) -> int:
        return run_process(self.run_dir, kind)

    # ---- checking --------------------------------------------------------------------------

    def trained_counts(self) -> dict[int, int]:
        with SampleStore.open(self.run_dir) as store:
            return store.trained_counts(self.run_id)

    def assert_trained_exactly_once(self) -> None:
        """Each step trained `groups x n` samples and every stored sample of those steps is trained
        once: the store refuses to mark a sample at a second step, and a sample generated twice
        would show up as an extra row."""
        want = {step: self.groups * self.n for step in range(self.steps)}
        assert self.trained_counts() == want, self.tail()
        with SampleStore.open(self.run_dir) as store:
            assert store.count_samples(self.run_id) == self.steps * self.groups * self.n
            assert store.count_samples(self.run_id, untrained=True) == 0

    def assert_on_policy(self, max_staleness: int = 0) -> dict[int, set[int]]:
        """Every trained sample of step k was sampled under policy version k - max_staleness ... k
        (version k is the policy after k steps: vLLM reports it per response, `"default"` for
        the base checkpoint, i.e. 0). Returns each step's versions, for the test's report."""
        seen: dict[int, set[int]] = {}
        with SampleStore.open(self.run_dir) as store:
            for step in sorted(store.trained_counts(self.run_id)):
                for sample in filter(trainable, store.read_step_samples(self.run_id, step)):
                    versions = sampled_versions(sample)
                    assert versions, f"step {step}: a sample without a reported policy version"
                    assert all(v is not None and step - max_staleness <= v <= step for v in versions), (
                        f"step {step} trained a sample of policy version {sample.weight_versions} "
                        f"(bound {step - max_staleness}..{step}):\n{self.tail()}")
                    seen.setdefault(step, set()).update(versions)
        return seen

    def assert_nothing_left(self, timeout: float = 30) -> None:
        self.wait_for_nothing_left(timeout)

    def wait_for_nothing_left(self, timeout: float = 30) -> float:
        t0 = time.monotonic()
        while leftover_processes(self.run_dir):
            if time.monotonic() - t0 > timeout:
                left = [(p, _cmd(p)) for p in leftover_processes(self.run_dir)]
                raise AssertionError(f"processes of {self.run_dir} still running: {left}")
            time.sleep(0.2)
        return time.monotonic() - t0


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:200]
    except OSError:
        return "?"
