"""Two FSDP2 ranks (gloo, torchrun) train exactly like one: rank 0 drives, rank 1 follows."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.test_trainer import synthetic_batch
from vime.store import SampleStore

SCRIPT = """
import json, sys
from vime.config.args import parse_args
from vime.config.run_args import run_configs
from vime.train import distributed as dist_utils
from vime.train.trainer_group import TrainerGroup

argv, steps_path, out_path = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
args = parse_args(argv)
group = TrainerGroup(args, run_configs(args))
if dist_utils.rank() != 0:
    group.follow()
else:
    group.call("attach", "run", 0, None)
    steps = [group.call("train_step", "run", i) for i in range(json.load(open(steps_path)))]
    group.stop()
    json.dump(steps, open(out_path, "w"))
"""


def run_ranks(nproc: int, argv: list[str], steps: Path, out: Path) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", str(out.with_suffix(".py")), json.dumps(argv), str(steps), str(out)]
    out.with_suffix(".py").write_text(SCRIPT)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VIME_LOG_LEVEL": "WARNING"}
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("extra", [[], ["--lora-rank", "8", "--lr", "1e-2"]], ids=["full", "lora"])
def test_two_ranks_give_the_same_losses_and_gradients_as_one(tiny_model_dir, tmp_path, extra):
    with SampleStore.open(tmp_path) as store:
        store.ensure_run("run")
        for step in range(2):
            by_rollout = {}
            for s in synthetic_batch(step):
                s.rollout_id = f"{step}-{s.rollout_id}"
                by_rollout[s.rollout_id] = [s]
            store.write_rollouts("run", by_rollout)
            store.write_step_manifest("run", step, list(by_rollout))
    (tmp_path / "steps.json").write_text(json.dumps(2))
    base = ["--hf-checkpoint", str(tiny_model_dir), "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--global-batch-size", "8", "--lr", "1e-3", "--max-tokens-per-gpu", "40", "--run-id", "run", *extra]

    one = run_ranks(1, base + ["--store-url", f"sqlite:///{tmp_path}/vime.db", "--run-dir", str(tmp_path / "a")],
                    tmp_path / "steps.json", tmp_path / "one.json")
    with SampleStore.open(tmp_path) as store, store.engine.begin() as conn:
        conn.exec_driver_sql("UPDATE samples SET trained_step = NULL")  # the same samples, trained again
    two = run_ranks(2, base + ["--store-url", f"sqlite:///{tmp_path}/vime.db", "--run-dir", str(tmp_path / "b")],
                    tmp_path / "steps.json", tmp_path / "two.json")
    for a, b in zip(one, two):
        assert abs(a["loss"] - b["loss"]) < 1e-5
        assert abs(a["grad_norm"] - b["grad_norm"]) / a["grad_norm"] < 1e-3
        assert a["optimizer_steps"] == b["optimizer_steps"] == 2


COLLECTIVES = """
import json, sys
from vime.train import distributed as dist_utils

dist_utils.init_distributed()
me = dist_utils.rank()
sent = [{"cmd": "train_step", "args": ("run", 3)}, b"x" * 1_000_003, None, ("stop", ())]
got = [dist_utils.broadcast_object(obj if me == 0 else "ignored") for obj in sent]
total = dist_utils.all_reduce_sum({"a": 1.0 + me, "b": 2.0})
held = [work.is_completed() for work in dist_utils._held]
dist_utils.shutdown()
json.dump({"same": got == sent, "total": total, "held": held}, open(sys.argv[1] + f".{me}", "w"))
"""


def test_two_ranks_broadcast_any_object_and_keep_each_collective_until_they_exit(tmp_path):
    # gloo's worker thread must never free a collective's tensors: late, at interpreter exit, it
    # aborted the process (1 in 13 two-rank runs under load). The calling thread keeps them.
    script = tmp_path / "collectives.py"
    script.write_text(COLLECTIVES)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", str(script), str(tmp_path / "out")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        out = json.loads((tmp_path / f"out.{rank}").read_text())
        assert out["same"] is True
        assert out["total"] == {"a": 3.0, "b": 4.0}
        assert out["held"] == [True] * 8  # the newest 8 of 4 x 2 broadcasts and the all-reduce


@pytest.mark.vllm
def test_a_long_lived_trainer_under_torchrun_is_one_trainer_and_a_sigterm_of_it_loses_no_step(training_server,
                                                                                               tiny_model_dir, tmp_path):
    """deploy/'s way: `torchrun --nproc-per-node 2 -m workers.trainer`, here started with only the store and
    Temporal's address. Its ranks are one trainer (each took itself for rank 0 and served Temporal alone,
    then hung at the first attach); SIGTERM of the group after two steps and a new group: every step
    trained once, every sample from its step's own weights."""
    from tests.runs import write_prompts
    from vime.engine.server import free_port
    from vime.rollout.policy_check import sampled_versions
    from vime.temporal.dev_server import temporal_cli_path

    repo, temporal, port = Path(__file__).resolve().parents[1], str(temporal_cli_path()), free_port()
    address, store_url = f"127.0.0.1:{port}", f"sqlite:///{tmp_path}/vime.db"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "VIME_LOG_LEVEL": "INFO"}
    procs: list[subprocess.Popen] = []

    def start(cmd: list[str], log: str) -> subprocess.Popen:
        procs.append(subprocess.Popen(cmd, cwd=repo, env=env, stdout=open(tmp_path / log, "w"),
                                      stderr=subprocess.STDOUT, start_new_session=True))
        return procs[-1]

    trainer = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", "127.0.0.1:0", "-m", "workers.trainer", "--store-url", store_url,
               "--temporal-address", address]
    try:
        start([temporal, "server", "start-dev", "--port", str(port), "--headless", "--ui-port", str(free_port())],
              "temporal.log")
        while subprocess.run([temporal, "operator", "cluster", "health", "--address", address],
                             capture_output=True).returncode:
            time.sleep(0.5)
        start([sys.executable, "-m", "workers.rollout", "--store-url", store_url, "--temporal-address", address],
              "rollout.log")
        first = start(trainer, "trainer-1.log")
        url = f"http://127.0.0.1:{training_server.port}"
        config = subprocess.run(
            [sys.executable, "-m", "vime.cli", "config", "--run-id", "exp", "--hf-checkpoint", str(tiny_model_dir),
             "--prompt-data", str(write_prompts(tmp_path / "prompts.jsonl", 8)), "--input-key", "prompt",
             "--label-key", "label", "--rm-type", "exact_match", "--rollout-batch-size", "2",
             "--n-samples-per-prompt", "4", "--global-batch-size", "8", "--rollout-max-response-len", "8",
             "--num-rollout", "5", "--save-interval", "2", "--save", str(tmp_path / "ckpt"), "--store-url", store_url,
             "--vllm-router-ip", "127.0.0.1", "--vllm-router-port", str(training_server.port),
             "--vllm-server-urls", url], cwd=repo, env=env, capture_output=True, text=True, check=True)
        (tmp_path / "exp.json").write_text(config.stdout)
        subprocess.run([temporal, "workflow", "start", "--address", address, "--type", "TrainingWorkflow",
                        "--task-queue", "vime-rollout", "--workflow-id", "train-exp", "--input-file",
                        str(tmp_path / "exp.json")], check=True, capture_output=True)
        deadline = time.monotonic() + 300
        while len(trained(store_url)) < 2:
            assert time.monotonic() < deadline and first.poll() is None, (tmp_path / "trainer-1.log").read_text()[-3000:]
            time.sleep(0.3)
        os.killpg(first.pid, signal.SIGTERM)
        first.wait(timeout=60)
        start(trainer, "trainer-2.log")
        result = subprocess.run([temporal, "workflow", "result", "--address", address, "--workflow-id", "train-exp"],
                                capture_output=True, text=True, timeout=600)
    finally:  # SIGTERM first: torchrun's ranks are in sessions of their own, and only it stops them
        for proc in reversed(procs):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
    assert not processes_naming(tmp_path)  # nothing left running, no rank either
    log_1 = (tmp_path / "trainer-1.log").read_text()
    assert "COMPLETED" in result.stdout, result.stdout[-2000:] + (tmp_path / "trainer-2.log").read_text()[-3000:]
    assert log_1.count("worker trainer ready") == 1, log_1[-3000:]  # rank 0 serves; rank 1 follows it
    assert "[rank0]: Traceback" not in log_1, log_1[-3000:]
    assert trained(store_url) == {step: 8 for step in range(5)}
    with SampleStore.open(store_url) as store:
        for step in range(5):
            assert {tuple(sampled_versions(s)) for s in store.read_step_samples("exp", step)} == {(step,)}


def trained(store_url: str) -> dict[int, int]:
    with SampleStore.open(store_url) as store:
        return store.trained_counts("exp")


def processes_naming(path: Path) -> list[str]:
    """Command lines of live processes that name `path` (a run's store, its logs)."""
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and str(path) in (cmd := (entry / "cmdline").read_bytes().decode(errors="replace")):
                found.append(cmd.replace("\0", " "))
    return found
