"""The rollout worker's Prometheus endpoint (`--metrics-port`): what an operator of long-lived
workers watches across every run they serve, scraped at `http://<worker>:<port>/metrics`.

Per run (label `run`), from the metrics lines this worker records (the training workflow's
`record_metrics` runs here, so every step of a run it drives passes through): steps, samples
trained, failed samples, the last reward and policy version, and the seconds of each step's phases
(`rollout`, `train`, `sync`) as histograms. Per task queue (labels `queue`, `kind`), polled from
Temporal every few seconds: the backlog of tasks no worker has taken yet and the age of its oldest.

Counters count what this process recorded since it started (Prometheus's `rate()` and `increase()`
handle a restart); a line this worker's log replays to a dashboard at open is not counted again.
"""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from vime.log import get_logger

log = get_logger(__name__)

PHASES = {"rollout": "rollout_wait_seconds", "train": "train_phase_seconds", "sync": "sync_seconds"}
"""Histogram phase label -> the metrics line's key."""
PHASE_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800)
QUEUE_POLL_S = 5.0


class WorkerMetrics:
    """One worker process's registry, its HTTP server and its task-queue poller."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.steps = Counter("vime_steps", "Training steps recorded (metrics lines written).", ["run"], registry=r)
        self.step = Gauge("vime_step", "The last step recorded.", ["run"], registry=r)
        self.samples = Counter("vime_samples", "Samples trained.", ["run"], registry=r)
        self.failed_samples = Counter("vime_failed_samples", "Samples that failed (not trained).", ["run"], registry=r)
        self.reward = Gauge("vime_reward_mean", "Mean reward of the last step's samples.", ["run"], registry=r)
        self.weight_version = Gauge("vime_weight_version", "Weight syncs the run's servers have had.", ["run"],
                                    registry=r)
        self.phase_seconds = Histogram("vime_step_phase_seconds", "Seconds of a step's phase: rollout (waiting "
                                       "for its groups), train, sync (weights to the servers).", ["run", "phase"],
                                       buckets=PHASE_BUCKETS, registry=r)
        self.backlog = Gauge("vime_task_queue_backlog", "Tasks waiting on a Temporal task queue (approximate).",
                             ["queue", "kind"], registry=r)
        self.backlog_age = Gauge("vime_task_queue_backlog_age_seconds", "Age of the oldest waiting task.",
                                 ["queue", "kind"], registry=r)
        self._server = None

    def observe(self, run_id: str, step: int, metrics: dict[str, Any]) -> None:
        """A metrics line this worker wrote."""
        if metrics.get("eval_only"):  # the round after the last step: no training step
            return
        self.steps.labels(run_id).inc()
        self.step.labels(run_id).set(step)
        for counter, key in ((self.samples, "samples"), (self.failed_samples, "failed_samples")):
            if isinstance(metrics.get(key), int | float):
                counter.labels(run_id).inc(metrics[key])
        for gauge, key in ((self.reward, "reward_mean"), (self.weight_version, "weight_version")):
            if isinstance(metrics.get(key), int | float):
                gauge.labels(run_id).set(metrics[key])
        for phase, key in PHASES.items():
            if isinstance(metrics.get(key), int | float):
                self.phase_seconds.labels(run_id, phase).observe(metrics[key])

    def sink(self, run_id: str) -> RunSink:
        return RunSink(self, run_id)

    def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve `/metrics` from a daemon thread; the port it listens on (0 picks a free one)."""
        self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    async def poll_queues(self, client: Any, namespace: str, queues: list[tuple[str, str]],
                          every: float = QUEUE_POLL_S) -> None:
        """Until cancelled: each (queue, kind) backlog from Temporal (`kind`: workflow or activity).
        A failed poll (Temporal restarting) keeps the last values and tries again."""
        from temporalio.api.enums.v1 import TaskQueueType
        from temporalio.api.taskqueue.v1 import TaskQueue
        from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

        kinds = {"workflow": TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, "activity": TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY}
        while True:
            for queue, kind in queues:
                try:
                    answer = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
                        namespace=namespace, task_queue=TaskQueue(name=queue), task_queue_type=kinds[kind],
                        report_stats=True))
                except Exception as e:  # noqa: BLE001 - a scrape shows the last values meanwhile
                    log.warning("metrics.queue_poll_failed", queue=queue, kind=kind, error=repr(e))
                    continue
                stats = answer.stats
                self.backlog.labels(queue, kind).set(stats.approximate_backlog_count)
                self.backlog_age.labels(queue, kind).set(stats.approximate_backlog_age.ToTimedelta().total_seconds())
            await asyncio.sleep(every)


class RunSink:
    """A run's metrics lines into the worker's registry (a `vime.metrics_log` sink). It claims every
    step as written, so a log opening on a relaunch replays no line into the counters."""

    def __init__(self, metrics: WorkerMetrics, run_id: str) -> None:
        self.metrics, self.run_id = metrics, run_id

    def written(self, step: int) -> bool:
        return True

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        self.metrics.observe(self.run_id, step, metrics)

    def close(self) -> None:
        pass
