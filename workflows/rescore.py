"""`RescoreWorkflow`: a run's stored samples scored again by other reward code, without sampling.

Pages through the run's samples (one activity per page); each page's new rewards are stored
beside the samples' own (`SampleStore.write_rescores`: first write wins, the samples are never
changed). Every page is idempotent, so a retried page, a resumed workflow or a second rescore
with the same code (the same `scorer`) writes nothing new.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

from vime.temporal.error_types import CONFIG_ERROR
from vime.temporal.rescore import (
    PAGE_HEARTBEAT_SECONDS,
    RESCORE_PAGE,
    RESCORE_WORKFLOW,
    RescoreInput,
    RescoreOutput,
    RescorePage,
    RescorePageResult,
)


@workflow.defn(name=RESCORE_WORKFLOW)
class RescoreWorkflow:
    @workflow.run
    async def run(self, inp: RescoreInput) -> RescoreOutput:
        while True:
            page = await workflow.execute_activity(
                RESCORE_PAGE, RescorePage(inp.run_id, inp.scorer, inp.custom_rm_path, inp.group_rm, inp.after_id,
                                          inp.page_size),
                result_type=RescorePageResult, start_to_close_timeout=timedelta(minutes=30),
                heartbeat_timeout=timedelta(seconds=PAGE_HEARTBEAT_SECONDS),
                retry_policy=RetryPolicy(maximum_attempts=5, non_retryable_error_types=[CONFIG_ERROR]))
            inp.samples, inp.written, inp.after_id = inp.samples + page.samples, inp.written + page.written, page.last_id
            if page.samples < inp.page_size:
                return RescoreOutput(inp.samples, inp.written)
            if workflow.info().is_continue_as_new_suggested():
                workflow.continue_as_new(inp)
