"""`record_metrics`: a finished step's metrics to `<run_dir>/metrics.jsonl` (vime.metrics_log).

A local activity of the training workflow, on the rollout worker that runs it: the file is the
record of a run that nobody followed from a terminal (started from the Temporal CLI or UI). The
run directory is the run's own (`--run-dir` of its config), whichever run the worker serves.
"""

from __future__ import annotations

from temporalio import activity

from vime.temporal.store_calls import store_call
from vime.metrics_log import MetricsLog
from vime.config.run_args import RunArgs
from workflows.steps import RECORD_METRICS, StepMetrics


class MetricsActivities:
    def __init__(self, runs: RunArgs) -> None:
        self.runs = runs

    @activity.defn(name=RECORD_METRICS)
    async def record_metrics(self, inp: StepMetrics) -> bool:
        def write() -> bool:
            log = self.runs.derived(inp.run_id, "metrics_log", lambda args: MetricsLog(args.run_dir))
            return log.write(inp.step, inp.metrics)
        return await store_call(write)
