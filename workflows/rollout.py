"""RolloutWorkflow: one prompt group (its n samples) → generate, reward, store → rollout ids.

One workflow per group for single-turn RL: a workflow per sample would cost more than the
sample (see notes/peers-measured.md). The id is deterministic (`<run>-rollout-<position>`),
so a retried start never duplicates a group; the activity is idempotent on the same key,
so a retried activity never duplicates a sample. Token data goes to the store; only rollout
ids and small summaries come back.

Failure semantics of the activity (see activities/rollout.py):
- a group any of whose rollouts hit an infrastructure failure (engine down or cut off, store
  unreachable) is not stored: the activity fails with a retryable error and Temporal retries it
  (every `RETRY_MAX_INTERVAL` at most, without limit) until the engine is back — a group is
  never trained short, and no prompt position is burnt;
- a configuration error (a reward function that raises or returns NaN, a generate hook that
  breaks the Sample contract) is non-retryable: the workflow fails with the hook's message,
  and the training workflow stops the run with it;
- a sample the model or the user's hook failed (an exception, an HTTP 4xx, a hook past its
  timeout) is stored FAILED with its error; `errors` and `first_error` carry it up, the group
  is not kept (a hook's failure) and the training workflow counts it against
  `--max-failed-sample-ratio` (`workflows.failures`), stopping the run with the first error above it.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, TypedSearchAttributes
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import CONFIG_ERROR
    from vime.temporal.group_output import RolloutOutput  # the group contract, below workflows/ (re-exported)
    from vime.temporal.search_attributes import POLICY_VERSION, REWARD, ROLLOUT_ID, ROLLOUT_STATUS, RUN_ID

GENERATE_GROUP = "generate_group"
RETRY_MAX_INTERVAL = timedelta(seconds=10)


def rollout_retry_policy() -> RetryPolicy:
    """Infra failures retry until the engine is back; configuration errors never retry."""
    return RetryPolicy(initial_interval=timedelta(seconds=1), backoff_coefficient=2.0,
                       maximum_interval=RETRY_MAX_INTERVAL, maximum_attempts=0,
                       non_retryable_error_types=[CONFIG_ERROR])


@dataclass
class RolloutInput:
    run_id: str
    step: int
    position: int  # the data source's prompt position: group_index of the samples
    weight_version: int
    evaluation: bool = False
    heartbeat_seconds: float = 60.0
    local_activity: bool = False  # generate in the workflow's own worker (see RolloutWorkflow)
    # For environments whose group workflow fans out (vime.envs): the run's settings it needs.
    n_samples_per_prompt: int = 1
    sandbox_task_queue: str = "vime-sandbox"


MEMO_PREVIEW_PATCH = "memo-preview"  # groups recorded before the memo replay without it


def rollout_workflow_id(run_id: str, position: int) -> str:
    return f"{run_id}-rollout-{position}"


def starting_search_attributes(inp: RolloutInput) -> TypedSearchAttributes:
    """What a group's workflow is searchable by from its start (given by the parent at start: no
    upsert, one visibility write fewer per group)."""
    return TypedSearchAttributes([
        RUN_ID.value_set(inp.run_id),
        ROLLOUT_ID.value_set(str(inp.position)),
        POLICY_VERSION.value_set(inp.weight_version),
        ROLLOUT_STATUS.value_set("running"),
    ])


@workflow.defn(name="RolloutWorkflow")
class RolloutWorkflow:
    """One group: generate (an activity), then the final status and reward as search attributes.

    With `local_activity` (what the TrainingWorkflow asks for) the group is generated as a local
    activity, in the worker that runs this workflow: no activity task to dispatch, and the whole
    workflow usually takes one workflow task. It stays durable: a worker that dies mid-group
    leaves the workflow task to time out, and the next worker replays the workflow and generates
    the group again (the store keeps the first write). Started without search attributes (the
    CLI, the bench), the workflow sets them itself.
    """

    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutOutput:
        if workflow.info().typed_search_attributes.get(RUN_ID) is None:
            workflow.upsert_search_attributes(list(starting_search_attributes(inp)))
        try:
            out = await self._generate(inp)
        except (asyncio.CancelledError, ActivityError) as e:
            if isinstance(e, asyncio.CancelledError) or isinstance(e.cause, CancelledError):
                # the training workflow cancelled it (stale, or the run ended)
                workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("cancelled")])
            raise
        updates = [ROLLOUT_STATUS.value_set(out.status if out.keep else "filtered")]
        if out.reward_mean is not None:
            updates.append(REWARD.value_set(out.reward_mean))
        workflow.upsert_search_attributes(updates)
        if out.preview is not None and workflow.patched(MEMO_PREVIEW_PATCH):
            workflow.upsert_memo({"samples": out.preview})
        out.preview = None
        return out

    async def _generate(self, inp: RolloutInput) -> RolloutOutput:
        if inp.local_activity:
            return await workflow.execute_local_activity(
                GENERATE_GROUP, inp, result_type=RolloutOutput, start_to_close_timeout=timedelta(hours=2),
                retry_policy=rollout_retry_policy())
        return await workflow.execute_activity(
            GENERATE_GROUP,
            inp,
            result_type=RolloutOutput,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
            retry_policy=rollout_retry_policy(),
        )


ROLLOUT_STEP = "generate_rollout_step"


@dataclass
class RolloutStepInput:
    """A whole rollout step by the user's `--rollout-function-path` (one heartbeating activity)."""

    run_id: str
    step: int
    position: int  # the data source's position before the step
    weight_version: int
    heartbeat_seconds: float = 60.0


@dataclass
class RolloutStepOutput:
    groups: list[RolloutOutput] = field(default_factory=list)
    next_position: int = 0
