"""RolloutWorkflow: one prompt group (its n samples) → generate, reward, store → refs.

One workflow per group for single-turn RL: a workflow per sample would cost more than the
sample (see notes/peers-measured.md). The id is deterministic (`<run>-rollout-<position>`),
so a retried start never duplicates a group; the activity is idempotent on the same key,
so a retried activity never duplicates a sample. Token data goes to the store; only refs
and small summaries come back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from vime.temporal.search_attributes import POLICY_VERSION, REWARD, ROLLOUT_ID, ROLLOUT_STATUS, RUN_ID
    from vime.types import RolloutRef

GENERATE_GROUP = "generate_group"


@dataclass
class RolloutInput:
    run_id: str
    step: int
    position: int  # the data source's prompt position: group_index of the samples
    weight_version: int
    evaluation: bool = False
    heartbeat_seconds: float = 60.0


@dataclass
class RolloutOutput:
    position: int
    rollouts: list[RolloutRef] = field(default_factory=list)
    keep: bool = True  # the dynamic-sampling filter's verdict for the group
    filter_reason: str | None = None
    reward_mean: float | None = None
    status: str = "completed"


def rollout_workflow_id(run_id: str, position: int) -> str:
    return f"{run_id}-rollout-{position}"


@workflow.defn(name="RolloutWorkflow")
class RolloutWorkflow:
    @workflow.run
    async def run(self, inp: RolloutInput) -> RolloutOutput:
        workflow.upsert_search_attributes([
            RUN_ID.value_set(inp.run_id),
            ROLLOUT_ID.value_set(str(inp.position)),
            POLICY_VERSION.value_set(inp.weight_version),
            ROLLOUT_STATUS.value_set("running"),
        ])
        out = await workflow.execute_activity(
            GENERATE_GROUP,
            inp,
            result_type=RolloutOutput,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=timedelta(seconds=inp.heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=["ConfigError"]),
        )
        updates = [ROLLOUT_STATUS.value_set(out.status if out.keep else "filtered")]
        if out.reward_mean is not None:
            updates.append(REWARD.value_set(out.reward_mean))
        workflow.upsert_search_attributes(updates)
        return out


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
