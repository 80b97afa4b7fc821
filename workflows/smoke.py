"""SmokeWorkflow: one activity that samples from the rollout engine; proves the wiring.

`vime smoke` runs it against the embedded services. Like every workflow module it imports
nothing heavy: the activity is called by name, its input and output are small dataclasses
(`vime.temporal.smoke`). `workers/smoke.py` serves it.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from vime.temporal.smoke import SMOKE_GENERATE, SMOKE_WORKFLOW, SmokeInput, SmokeResult


@workflow.defn(name=SMOKE_WORKFLOW)
class SmokeWorkflow:
    @workflow.run
    async def run(self, inp: SmokeInput) -> SmokeResult:
        return await workflow.execute_activity(
            SMOKE_GENERATE,
            inp,
            result_type=SmokeResult,
            start_to_close_timeout=timedelta(minutes=5),
            retry_policy=RetryPolicy(maximum_attempts=3),
        )
