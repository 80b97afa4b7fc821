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
from temporalio.exceptions import ActivityError, CancelledError

with workflow.unsafe.imports_passed_through():
    from vime.envs.contract import GroupInput, GroupOutput
    from vime.envs.group_workflow import finish_group, starting_search_attributes
    from vime.temporal.activity_bounds import rollout_activity_options
    from vime.temporal.retry import rollout_retry_policy
    from vime.temporal.search_attributes import ROLLOUT_STATUS, RUN_ID

GENERATE_GROUP = "generate_group"

# The single-turn groups' names for the group contract (`vime.envs.contract`), kept for the
# training workflow and the activities that import them by these names.
RolloutInput = GroupInput
RolloutOutput = GroupOutput


@workflow.defn(name="RolloutWorkflow", sandboxed=False)
class RolloutWorkflow:
    """One group: generate (an activity), then the final status and reward as search attributes.

    It runs outside Temporal's workflow sandbox, as the TrainingWorkflow that starts it: eight of
    them a step made the sandbox's per-activation work 0.07 s of a quickstart step's 0.45 s
    rollout phase. `tests/test_unsandboxed_workflows.py` checks in the source what the sandbox
    checked at run time (only deterministic modules, no clock, no files).

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
        return finish_group(out, status=out.status if out.keep else "filtered")

    async def _generate(self, inp: RolloutInput) -> RolloutOutput:
        if inp.local_activity:
            return await workflow.execute_local_activity(
                GENERATE_GROUP, inp, result_type=RolloutOutput, start_to_close_timeout=timedelta(hours=2),
                retry_policy=rollout_retry_policy())
        return await workflow.execute_activity(GENERATE_GROUP, inp, result_type=RolloutOutput,
                                               **rollout_activity_options(inp.heartbeat_seconds))


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
