"""`vime fleet` and `vime train --fleet DIR`: a shared fleet (Temporal, store, one LoRA-enabled
vLLM server, long-lived workers) started once, and LoRA runs that start on it in seconds.

The bad-input tests need no services (a fleet.json written as `vime fleet` writes it, naming a
live pid); the end-to-end test starts a real fleet on the tiny model and trains two runs on it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs import REPO, write_prompts
from tests.test_bad_input import one_line_error
from vime.launcher.fleet_info import FleetInfo, fleet_path, write_fleet
from vime.procs import kill_leftovers, leftover_processes
from vime.rundir import RunDirLock
from vime.store import SampleStore

ENV = {**os.environ, "VIME_LOG_FORMAT": "json", "VIME_LOG_LEVEL": "WARNING"}


def vime(*argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vime.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          env=ENV, timeout=timeout)


def run_flags(tmp_path: Path, run: str, steps: int) -> list[str]:
    """A small LoRA run (test_lora_run.py's shape): 2 groups x 2 samples a step, 8 tokens."""
    prompts = tmp_path / "prompts.jsonl"
    if not prompts.exists():
        write_prompts(prompts)
    return ["--run-id", run, "--run-dir", str(tmp_path / run), "--lora-rank", "8", "--prompt-data", str(prompts),
            "--input-key", "prompt", "--label-key", "label", "--rm-type", "random", "--lr", "1e-3",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--num-rollout", str(steps),
            "--rollout-max-response-len", "8"]


def fake_fleet_json(fleet_dir: Path, model: Path) -> None:
    """fleet.json as `vime fleet` writes it, naming this (live) process: the checks run before
    anything connects, so no service is needed to see them refuse."""
    fleet_dir.mkdir(parents=True, exist_ok=True)
    write_fleet(fleet_dir, FleetInfo("127.0.0.1:1", "default", f"sqlite:///{fleet_dir}/vime.db",
                                     ["http://127.0.0.1:2"], "127.0.0.1", 2, str(model), 16, os.getpid()))


def test_a_fleet_run_without_a_fleet_says_to_start_one(tmp_path):
    done = vime("train", "--fleet", str(tmp_path / "fleet"), *run_flags(tmp_path, "a", 2))
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert str(tmp_path / "fleet") in line and f"vime fleet --fleet-dir {tmp_path / 'fleet'}" in line, line


def test_a_full_fine_tune_on_a_fleet_is_refused(tmp_path, tiny_model_dir):
    fake_fleet_json(tmp_path / "fleet", tiny_model_dir)
    done = vime("train", "--fleet", str(tmp_path / "fleet"), *run_flags(tmp_path, "a", 2), "--lora-rank", "0")
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert "needs --lora-rank" in line and "full fine-tune" in line, line


def test_another_base_model_on_a_fleet_is_refused(tmp_path, tiny_model_dir):
    fake_fleet_json(tmp_path / "fleet", tiny_model_dir)
    other = tmp_path / "other-model"
    other.mkdir()
    done = vime("train", "--fleet", str(tmp_path / "fleet"), "--hf-checkpoint", str(other),
                *run_flags(tmp_path, "a", 2))
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert f"--hf-checkpoint {other}" in line and f"serves {tiny_model_dir}" in line, line


def test_a_second_fleet_on_a_live_fleet_directory_is_refused(tmp_path, tiny_model_dir):
    with RunDirLock(tmp_path / "fleet"):  # what a live `vime fleet` holds
        done = vime("fleet", "--fleet-dir", str(tmp_path / "fleet"), "--hf-checkpoint", str(tiny_model_dir))
    assert done.returncode == 2
    line = one_line_error(done.stderr)
    assert "a fleet already serves it" in line and f"pid {os.getpid()}" in line, line


class Fleet:
    """`vime fleet` as a subprocess, its console in fleet.log."""

    def __init__(self, fleet_dir: Path, model: Path, env: dict[str, str] | None = None) -> None:
        self.dir = fleet_dir
        self.log = fleet_dir.parent / "fleet.log"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "vime.cli", "fleet", "--fleet-dir", str(fleet_dir), "--hf-checkpoint", str(model),
             "--lora-max-rank", "8", "--vllm-max-model-len", "512"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, cwd=REPO, env=env or ENV)

    def output(self) -> str:
        return self.log.read_text()

    def wait_ready(self, timeout: float) -> None:
        t0 = time.monotonic()
        while "fleet ready in" not in self.output():
            assert self.process.poll() is None, f"vime fleet exited:\n{self.output()[-3000:]}"
            assert time.monotonic() - t0 < timeout, f"no fleet after {timeout} s:\n{self.output()[-3000:]}"
            time.sleep(0.5)

    def kill_all(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        kill_leftovers(self.dir, timeout=0)


def trained_exactly_once(store_url: str, run: str, steps: int, per_step: int) -> None:
    with SampleStore.open(store_url) as store:
        assert store.trained_counts(run) == {step: per_step for step in range(steps)}
        assert store.count_samples(run) == steps * per_step
        assert store.count_samples(run, untrained=True) == 0


@pytest.mark.vllm
def test_two_lora_runs_start_on_a_warm_fleet_and_sigterm_stops_every_part(tmp_path, tiny_model_dir):
    """A fleet; run a (3 steps) to its end, every sample trained once; the same command again says
    it finished; run b on the warm fleet, its launch → first step printed; run c detached by Ctrl-C
    after its first step and re-attached by the same command; SIGTERM: nothing left."""
    pytest.importorskip("peft")
    fleet_dir = tmp_path / "fleet"
    fleet = Fleet(fleet_dir, tiny_model_dir)
    try:
        t0 = time.monotonic()
        fleet.wait_ready(timeout=600)
        print(f"fleet ready after {time.monotonic() - t0:.1f} s:", [ln for ln in fleet.output().splitlines()
                                                                    if "fleet ready" in ln][0])
        store_url = f"sqlite:///{fleet_dir}/vime.db"
        assert f'"store_url": "{store_url}"' in fleet_path(fleet_dir).read_text()
        again = vime("fleet", "--fleet-dir", str(fleet_dir), "--hf-checkpoint", str(tiny_model_dir))
        assert again.returncode == 2 and "a fleet already serves it" in one_line_error(again.stderr)

        a = ["train", "--fleet", str(fleet_dir), *run_flags(tmp_path, "a", 3)]
        first = vime(*a)
        assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
        assert "run a finished: 3 steps, 3 trained by this launch" in first.stdout, first.stdout[-3000:]
        assert re.search(r"\[vime\] first step [\d.]+ s after the launch", first.stdout), first.stdout[-3000:]
        trained_exactly_once(store_url, "a", steps=3, per_step=4)
        with SampleStore.open(store_url) as store:  # step k sampled by the run's own adapter version k
            for step in (1, 2):
                for sample in store.read_step_samples("a", step):
                    assert {s.get("adapter") for s in sample.weight_versions} == {f"a-v{step}"}
        print("run a (the fleet's first):", re.search(r"\[vime\] first step .*", first.stdout)[0])

        t1 = time.monotonic()
        second = vime(*a, timeout=120)
        print(f"the same command again: exit {second.returncode} in {time.monotonic() - t1:.1f} s")
        assert second.returncode == 0 and "run a already finished (3 steps)" in second.stdout, second.stdout

        t2 = time.monotonic()
        b = vime("train", "--fleet", str(fleet_dir), *run_flags(tmp_path, "b", 2))
        assert b.returncode == 0, b.stdout[-3000:] + b.stderr[-3000:]
        printed = re.search(r"\[vime\] first step ([\d.]+) s after the launch", b.stdout)
        assert printed, b.stdout[-3000:]
        print(f"run b on the warm fleet: launch → first step {printed[1]} s (as printed); whole run "
              f"{time.monotonic() - t2:.1f} s")
        trained_exactly_once(store_url, "b", steps=2, per_step=4)

        c = ["train", "--fleet", str(fleet_dir), *run_flags(tmp_path, "c", 6)]  # Ctrl-C detaches; re-attach
        follow = subprocess.Popen([sys.executable, "-m", "vime.cli", *c], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, cwd=REPO, env=ENV)
        seen = ""
        for line in follow.stdout:
            seen += line
            if "first step" in line:
                follow.send_signal(signal.SIGINT)
                break
        seen += follow.communicate(timeout=60)[0]
        assert follow.returncode == 130, seen[-3000:]
        assert "[vime] detached from run c" in seen and "Re-attach with:" in seen and "vime cancel c" in seen, seen
        attached = vime(*c)
        assert attached.returncode == 0, attached.stdout[-3000:] + attached.stderr[-3000:]
        assert "run c is in progress; continuing it" in attached.stdout, attached.stdout[-3000:]
        assert "run c finished: 6 steps" in attached.stdout, attached.stdout[-3000:]
        trained_exactly_once(store_url, "c", steps=6, per_step=4)

        fleet.process.send_signal(signal.SIGTERM)
        assert fleet.process.wait(timeout=120) == 0, fleet.output()[-3000:]
        assert "stopped: every part of it is down" in fleet.output()
        assert not fleet_path(fleet_dir).exists()
        t3 = time.monotonic()
        while leftover_processes(fleet_dir):
            assert time.monotonic() - t3 < 30, f"left running: {leftover_processes(fleet_dir)}"
            time.sleep(0.2)
    finally:
        fleet.kill_all()


@pytest.mark.parametrize("flags, message", [
    (["--rollout-env", "tool_use"], "would sync merged weights into the fleet's shared server"),
    (["--vllm-max-model-len", "256"], "--vllm-max-model-len: the fleet in"),
])
def test_a_run_that_would_change_the_shared_server_is_refused(tmp_path, tiny_model_dir, flags, message):
    """Merged weights or server flags of its own would reach every other run on the fleet."""
    fake_fleet_json(tmp_path / "fleet", tiny_model_dir)
    done = vime("train", "--fleet", str(tmp_path / "fleet"), *run_flags(tmp_path, "a", 2), *flags)
    assert done.returncode == 2
    assert message in one_line_error(done.stderr), done.stderr


def test_a_run_followed_on_a_fleet_that_stops_ends_its_launch_with_one_line(tmp_path, tiny_model_dir):
    """Drilled: SIGTERM to `vime fleet` while `vime train --fleet` followed a run left the launch
    retrying the dead Temporal address, a warning a second; it now stops with what to do."""
    import asyncio

    from vime.errors import ServiceError
    from vime.launcher.fleet_launch import _FleetAlive

    fake_fleet_json(tmp_path / "fleet", tiny_model_dir)
    alive = _FleetAlive(str(tmp_path / "fleet"), "exp-a")
    asyncio.run(alive.check())  # this process is the "fleet": it serves
    (tmp_path / "fleet" / "fleet.json").unlink()  # what a stopped fleet leaves
    with pytest.raises(ServiceError, match=r"the fleet in .* stopped; run exp-a waits in its files: start the fleet "
                                           r"again \(vime fleet --fleet-dir .*\) and run this command again"):
        asyncio.run(alive.check())
