"""`record_metrics`: a finished step's metrics to `<run_dir>/metrics.jsonl` (vime.metrics_log).

A local activity of the training workflow, on the rollout worker that runs it: the file is the
record of a run that nobody followed from a terminal (started from the Temporal CLI or UI).
"""

from __future__ import annotations

import asyncio

from temporalio import activity

from vime.metrics_log import MetricsLog
from workflows.steps import RECORD_METRICS, StepMetrics


class MetricsActivities:
    def __init__(self, run_dir: str) -> None:
        self.log = MetricsLog(run_dir)

    @activity.defn(name=RECORD_METRICS)
    async def record_metrics(self, inp: StepMetrics) -> bool:
        return await asyncio.to_thread(self.log.write, inp.step, inp.metrics)
