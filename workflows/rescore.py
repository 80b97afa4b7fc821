"""`RescoreWorkflow`: a run's stored samples scored again by other reward code, without sampling.

Pages through the run's samples (one activity per page); each page's new rewards are stored
beside the samples' own (`SampleStore.write_rescores`: first write wins, the samples are never
changed). Every page is idempotent, so a retried page, a resumed workflow or a second rescore
with the same code (the same `scorer`) writes nothing new.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import CONFIG_ERROR

RESCORE_PAGE = "rescore_page"
RESCORE_TASK_QUEUE = "vime-rescore"
PAGE_HEARTBEAT_SECONDS = 60


@dataclass
class RescoreInput:
    run_id: str
    scorer: str  # names the reward code: a hash of its source
    custom_rm_path: str
    group_rm: bool = False
    page_size: int = 256
    after_id: int = 0  # where a continued-as-new workflow goes on
    samples: int = 0
    written: int = 0


@dataclass
class RescorePage:
    run_id: str
    scorer: str
    custom_rm_path: str
    group_rm: bool
    after_id: int
    limit: int


@dataclass
class RescorePageResult:
    last_id: int
    samples: int
    written: int


@dataclass
class RescoreOutput:
    samples: int  # samples scored
    written: int  # rewards stored by this rescore (0 when this code had scored them all before)


@workflow.defn(name="RescoreWorkflow")
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
