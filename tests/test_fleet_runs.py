"""Many LoRA runs at once on one fleet: one vLLM server and one trainer hold the base model once,
each run trains its own adapter with its own reward, and the fleet survives kill -9 of its shared
server and its shared trainer with three runs in flight.

Both tests share one `vime fleet` on the tiny model (module-scoped: a fleet costs ~45 s to start).
Each run is `vime train --fleet DIR ...` as a user types it, three at once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.runs import REPO, write_prompts
from tests.test_fleet import ENV, Fleet, trained_exactly_once, vime
from vime.procs import leftover_processes
from vime.rollout.policy_check import sampled_versions
from vime.store import SampleStore
from vime.train.trainer_group import trainable

pytest.importorskip("peft")
pytestmark = pytest.mark.vllm

REWARDS = '''
"""Three reward functions, one per run; each a pure function of the response text."""


async def length(args, sample):
    return len(sample.response) / 100.0


async def vowels(args, sample):
    return sum(sample.response.count(v) for v in "aeiou") / 10.0


async def no_spaces(args, sample):
    return float(" " not in sample.response)
'''

RUNS = {"len": "length", "vow": "vowels", "nsp": "no_spaces"}


def expected_reward(function: str, response: str) -> float:
    if function == "length":
        return len(response) / 100.0
    if function == "vowels":
        return sum(response.count(v) for v in "aeiou") / 10.0
    return float(" " not in response)


@pytest.fixture(scope="module")
def fleet(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet-runs")
    (root / "hooks").mkdir()
    (root / "hooks" / "fleet_rewards.py").write_text(REWARDS)  # the fleet's workers import the runs' hooks
    fleet = Fleet(root / "fleet", tiny_model_dir,
                  env={**ENV, "PYTHONPATH": f"{root / 'hooks'}{os.pathsep}{ENV.get('PYTHONPATH', REPO)}",
                       "VIME_LOG_LEVEL": "INFO"})  # the trainer's `trainer.attached` lines
    try:
        fleet.wait_ready(timeout=600)
        yield fleet
    finally:
        if fleet.process.poll() is None:
            fleet.process.send_signal(signal.SIGTERM)
            try:
                fleet.process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                pass
        fleet.kill_all()


def start_runs(fleet: Fleet, tmp_path: Path, steps: int, tag: str) -> dict[str, subprocess.Popen]:
    """Three `vime train --fleet` launches at once, each with its own reward function."""
    write_prompts(tmp_path / "prompts.jsonl")
    env = {**ENV, "PYTHONPATH": f"{fleet.dir.parent / 'hooks'}{os.pathsep}{ENV.get('PYTHONPATH', REPO)}"}
    procs = {}
    for run, function in RUNS.items():
        run_id = f"{tag}-{run}"
        argv = [sys.executable, "-m", "vime.cli", "train", "--fleet", str(fleet.dir), "--run-id", run_id,
                "--run-dir", str(tmp_path / run_id), "--lora-rank", "8", "--lr", "1e-2",
                "--prompt-data", str(tmp_path / "prompts.jsonl"), "--input-key", "prompt", "--label-key", "label",
                "--custom-rm-path", f"fleet_rewards.{function}", "--rollout-batch-size", "2",
                "--n-samples-per-prompt", "2", "--num-rollout", str(steps), "--rollout-max-response-len", "8"]
        procs[run_id] = subprocess.Popen(argv, stdout=open(tmp_path / f"{run_id}.out", "w"),
                                         stderr=subprocess.STDOUT, cwd=REPO, env=env)
    return procs


def finish(procs: dict[str, subprocess.Popen], tmp_path: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for run_id, proc in procs.items():
        try:
            code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            raise AssertionError(f"{run_id} still running:\n" + (tmp_path / f"{run_id}.out").read_text()[-3000:])
        assert code == 0, (tmp_path / f"{run_id}.out").read_text()[-3000:]


def assert_each_run_exact(fleet: Fleet, tmp_path: Path, tag: str, steps: int) -> None:
    """Every step of every run trained once; each trained sample of step k came from that run's
    own adapter at version k; its reward is its run's function of its response."""
    store_url = f"sqlite:///{fleet.dir}/vime.db"
    for run, function in RUNS.items():
        run_id = f"{tag}-{run}"
        trained_exactly_once(store_url, run_id, steps=steps, per_step=4)
        with SampleStore.open(store_url) as store:
            for step in range(steps):
                for sample in filter(trainable, store.read_step_samples(run_id, step)):
                    assert sampled_versions(sample) == [step] or set(sampled_versions(sample)) == {step}, (
                        run_id, step, sample.weight_versions)
                    adapters = {s.get("adapter") for s in sample.weight_versions if isinstance(s, dict)}
                    assert adapters <= {f"{run_id}-v{step}", None}, (run_id, step, adapters)
                    assert sample.reward == pytest.approx(expected_reward(function, sample.response)), (
                        run_id, sample.response, sample.reward)
        metrics = [json.loads(line) for line in (tmp_path / run_id / "metrics.jsonl").read_text().splitlines()]
        assert sorted({m["step"] for m in metrics}) == list(range(steps))
        for m in metrics:  # after each adapter sync the server computes the trainer's logprobs (fp32)
            assert m["sync_wire_bytes"] < m["sync_full_bytes"] / 20, m
            assert m["sync_probe_max_abs_diff"] <= 1e-3, m


def attach_lines(fleet: Fleet) -> list[dict]:
    lines = []
    for log in fleet.dir.rglob("*trainer*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if "trainer.attached" in line:
                try:
                    lines.append(json.loads(line[line.index("{"):]))
                except ValueError:
                    continue
    return lines


def first_attach_after(fleet: Fleet, at: float) -> float:
    from datetime import datetime

    times = [datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp() for e in attach_lines(fleet)]
    return min(t for t in times if t > at)


def held_together(fleet: Fleet) -> int:
    """The most runs the fleet's trainer held at once (its `trainer.attached` log lines)."""
    return max((len(e.get("held", [])) for e in attach_lines(fleet)), default=0)


def test_three_runs_with_their_own_rewards_train_at_once_on_one_server_and_one_trainer(fleet, tmp_path):
    steps = 3
    t0 = time.monotonic()
    procs = start_runs(fleet, tmp_path, steps, "r")
    finish(procs, tmp_path, timeout=900)
    print(f"3 runs x {steps} steps on one fleet: {time.monotonic() - t0:.1f} s")
    assert_each_run_exact(fleet, tmp_path, "r", steps)
    assert held_together(fleet) == 3  # one trainer held the three runs at once

    listed = vime("runs", "--fleet", str(fleet.dir), "--json")  # every run on the fleet, from its store
    assert listed.returncode == 0, listed.stderr
    states = {r["run_id"]: (r["state"], r["steps_trained"]) for r in json.loads(listed.stdout)}
    assert all(states[f"r-{run}"] == ("finished", steps) for run in RUNS), states
    status = vime("status", "r-len", "--fleet", str(fleet.dir))
    assert status.returncode == 0 and f"completed at step {steps}/{steps}" in status.stdout, status.stdout + status.stderr


def fleet_pid(fleet: Fleet, needle: str) -> int:
    import psutil

    for proc in psutil.Process(fleet.process.pid).children(recursive=True):
        try:
            line = " ".join(proc.cmdline())
            if needle in line and "vime.procguard" not in line:  # the process itself, not its guard
                return proc.pid
        except psutil.NoSuchProcess:
            continue
    raise AssertionError(f"no {needle!r} process under the fleet")


def orphans(fleet: Fleet) -> list[int]:
    """The fleet's processes that nothing supervises any more (reparented to init)."""
    import psutil

    return [pid for pid in leftover_processes(fleet.dir) if psutil.pid_exists(pid) and psutil.Process(pid).ppid() == 1]


def wait_steps(fleet: Fleet, runs: list[str], at_least: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with SampleStore.open(f"sqlite:///{fleet.dir}/vime.db") as store:
        while not all(len(store.trained_counts(r)) >= at_least for r in runs):
            assert time.monotonic() < deadline, {r: store.trained_counts(r) for r in runs}
            time.sleep(1)


def test_three_runs_survive_kill_9_of_the_shared_server_and_of_the_shared_trainer(fleet, tmp_path):
    steps = 5
    procs = start_runs(fleet, tmp_path, steps, "k")
    try:
        wait_steps(fleet, list(procs), 1, timeout=600)
        os.kill(fleet_pid(fleet, "vllm.entrypoints.openai.api_server"), signal.SIGKILL)
        wait_steps(fleet, list(procs), 3, timeout=900)  # past the restart, on the re-loaded adapters
        killed = time.time()
        os.kill(fleet_pid(fleet, "workers.trainer"), signal.SIGKILL)
        finish(procs, tmp_path, timeout=1200)
        assert orphans(fleet) == []  # vLLM's engine core and worker went with the killed server
        print(f"after kill -9 of the shared trainer, the first run attached again in "
              f"{first_attach_after(fleet, killed) - killed:.1f} s")
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
    assert_each_run_exact(fleet, tmp_path, "k", steps)
