"""A long-lived rollout worker started with `--metrics-port` serves Prometheus metrics: per run the
steps, samples and failed samples it recorded and each phase's seconds (the weight sync's too),
per task queue the backlog Temporal reports. The test scrapes the real worker process while two
runs' lines arrive as the training workflow sends them (`record_metrics` on the worker's queue);
no vLLM is needed for that."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from temporalio import workflow
from temporalio.worker import Worker

from tests.runs import write_prompts
from vime.config.args import parse_args
from vime.config.run_args import stored_config
from vime.engine.server import free_port
from vime.metrics_log import read_metrics
from vime.store import SampleStore
from workflows.steps import RECORD_METRICS, StepMetrics

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Lines:
    queue: str
    lines: list[StepMetrics]


@workflow.defn(sandboxed=False)
class RecordLines:
    """What the training workflow does with each finished step's line (on the rollout queue)."""

    @workflow.run
    async def run(self, inp: Lines) -> list[bool]:
        return [await workflow.execute_activity(RECORD_METRICS, line, task_queue=inp.queue, result_type=bool,
                                                start_to_close_timeout=timedelta(seconds=60)) for line in inp.lines]


@workflow.defn(sandboxed=False)
class WaitsForATrainer:
    """An activity on the trainer queue that no trainer serves: one task in its backlog."""

    @workflow.run
    async def run(self, queue: str) -> None:
        await workflow.execute_activity("pick_trainer", task_queue=queue, start_to_close_timeout=timedelta(hours=1))


def scrape(port: int) -> dict[tuple[str, frozenset], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


def line(step: int, samples: int, failed: int, sync: float) -> dict:
    return {"loss": 0.1, "reward_mean": step / 4, "samples": samples, "failed_samples": failed,
            "rollout_wait_seconds": 2.0, "train_phase_seconds": 1.0, "sync_seconds": sync,
            "weight_version": step + 1, "finished_at": 1.8e9 + step}


@pytest.mark.temporal
async def test_a_long_lived_rollout_worker_serves_each_runs_steps_samples_failures_sync_times_and_queue_backlogs(
        temporal_env, tmp_path):
    client = temporal_env.client
    address = client.service_client.config.target_host
    store_url = f"sqlite:///{tmp_path}/vime.db"
    queue = f"vime-rollout-{uuid.uuid4().hex[:8]}"  # the session's Temporal is shared: queues of our own
    trainer_queue, port = f"{queue}-trainer", free_port()
    write_prompts(tmp_path / "prompts.jsonl", 4)
    with SampleStore.open(store_url) as store:  # as each run's workflow records its flags when it starts
        for run in ("exp-a", "exp-b"):
            args = parse_args(["--run-id", run, "--run-dir", str(tmp_path / run), "--prompt-data",
                               str(tmp_path / "prompts.jsonl"), "--store-url", store_url])
            store.ensure_run(run, stored_config(args))

    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.rollout", "--store-url", store_url, "--temporal-address", address,
         "--rollout-task-queue", queue, "--trainer-task-queue", trainer_queue,
         "--sandbox-task-queue", f"{queue}-sandbox", "--metrics-port", str(port)],
        cwd=ROOT, stdout=open(tmp_path / "worker.log", "w"), stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        printed = await wait_for_line(worker, tmp_path / "worker.log", "worker rollout ready")
        assert f":{port}/metrics" in printed, printed
        lines = [StepMetrics("exp-a", 0, line(0, 16, 1, 0.25)), StepMetrics("exp-b", 0, line(0, 8, 0, 0.5)),
                 StepMetrics("exp-a", 1, line(1, 16, 0, 0.25)),
                 StepMetrics("exp-a", 1, line(1, 16, 0, 0.25)),  # a retried activity: written once, counted once
                 StepMetrics("exp-a", 2, {"eval_only": True, "eval/heldout/reward_mean": 0.5, "weight_version": 2})]
        backlog = await client.start_workflow(WaitsForATrainer.run, trainer_queue, id=f"waits-{queue}",
                                              task_queue=f"{queue}-test")
        async with Worker(client, task_queue=f"{queue}-test", workflows=[RecordLines, WaitsForATrainer]):
            written = await client.execute_workflow(RecordLines.run, Lines(queue, lines), id=f"lines-{queue}",
                                                    task_queue=f"{queue}-test",
                                                    execution_timeout=timedelta(seconds=120))
            assert written == [True, True, True, False, True]

            deadline = time.monotonic() + 30
            while not (value(found := await asyncio.to_thread(scrape, port), "vime_task_queue_backlog",
                             queue=trainer_queue, kind="activity") and value(found, "vime_steps_total", run="exp-a")):
                assert time.monotonic() < deadline, f"the trainer queue's backlog never showed: {found}"
                await asyncio.sleep(1)
            await backlog.terminate()

        assert value(found, "vime_steps_total", run="exp-a") == 2, "the eval-only line is no training step"
        assert value(found, "vime_steps_total", run="exp-b") == 1
        assert value(found, "vime_step", run="exp-a") == 1
        assert value(found, "vime_samples_total", run="exp-a") == 32
        assert value(found, "vime_failed_samples_total", run="exp-a") == 1
        assert value(found, "vime_failed_samples_total", run="exp-b") == 0
        assert value(found, "vime_reward_mean", run="exp-a") == 0.25
        assert value(found, "vime_weight_version", run="exp-b") == 1
        assert value(found, "vime_step_phase_seconds_count", run="exp-a", phase="sync") == 2
        assert value(found, "vime_step_phase_seconds_sum", run="exp-a", phase="sync") == 0.5
        assert value(found, "vime_step_phase_seconds_sum", run="exp-b", phase="rollout") == 2.0
        assert value(found, "vime_task_queue_backlog", queue=trainer_queue, kind="activity") == 1
        assert value(found, "vime_task_queue_backlog", queue=queue, kind="workflow") is not None
        assert [m["step"] for m in read_metrics(tmp_path / "exp-a")] == [0, 1, 2]
        assert [m["step"] for m in read_metrics(tmp_path / "exp-b")] == [0]
    finally:
        os.killpg(worker.pid, signal.SIGTERM)
        try:
            worker.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()


async def wait_for_line(worker: subprocess.Popen, log: Path, marker: str, timeout: float = 120.0) -> str:
    """The worker's output once it has the line with `marker` (its metrics address comes before)."""
    deadline = time.monotonic() + timeout
    while marker not in (text := log.read_text()):
        assert worker.poll() is None, f"the worker exited ({worker.returncode}):\n{text}"
        assert time.monotonic() < deadline, text
        await asyncio.sleep(0.5)
    return text
