"""`record_metrics`: a finished step's metrics to `<run_dir>/metrics.jsonl` and the run's sinks
(TensorBoard, W&B, this worker's Prometheus endpoint) through `vime.metrics_log`.

A local activity of the training workflow, on the rollout worker that runs it: the file is the
record of a run that nobody followed from a terminal (started from the Temporal CLI or UI). The
run directory is the run's own (`--run-dir` of its config), whichever run the worker serves. Each
run's log lives as long as its config: a run re-registered with other flags gets a new log, the
old one closed (its W&B run finished), and `close` finishes them all when the worker stops.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from temporalio import activity

from vime.config.flags import VimeArgs
from vime.config.run_args import RunArgs
from vime.metrics_log import MetricsLog, run_sinks
from vime.temporal.store_calls import store_call
from workflows.steps import RECORD_METRICS, StepMetrics

if TYPE_CHECKING:  # prometheus_client loads only on a worker with --metrics-port
    from vime.metrics.prometheus import WorkerMetrics


class MetricsActivities:
    def __init__(self, runs: RunArgs, exporter: WorkerMetrics | None = None) -> None:
        self.runs = runs
        self.exporter = exporter
        self._logs: dict[str, tuple[VimeArgs, MetricsLog]] = {}
        self._lock = threading.Lock()

    def log_of(self, run_id: str) -> MetricsLog:
        args = self.runs.args(run_id)
        with self._lock:
            kept = self._logs.get(run_id)
            if kept is not None and kept[0] is args:
                return kept[1]
            sinks = run_sinks(args) + ([self.exporter.sink(run_id)] if self.exporter else [])
            self._logs[run_id] = (args, MetricsLog(args.run_dir, sinks))
        if kept is not None:
            kept[1].close()
        return self._logs[run_id][1]

    @activity.defn(name=RECORD_METRICS)
    async def record_metrics(self, inp: StepMetrics) -> bool:
        return await store_call(lambda: self.log_of(inp.run_id).write(inp.step, inp.metrics))

    def close(self) -> None:
        with self._lock:
            logs, self._logs = [log for _, log in self._logs.values()], {}
        for log in logs:
            log.close()
