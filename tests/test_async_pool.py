"""The fully async pool (`workflows.async_pool`) inside a real Temporal workflow: every step gets
its batch whichever groups lose a sample to a failing hook or the filter, the run's last step
included (a group the step being taken loses is replaced, not waited for forever).

The groups are stand-ins (a timer, then a verdict by position): what is under test is the pool's
bookkeeping, which only a workflow can run (its tasks and conditions are scheduled from history).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta

import pytest
from temporalio import workflow
from temporalio.client import WorkflowFailureError
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from vime.temporal.group_contract import RolloutOutput
from workflows.async_pool import PoolConfig, RolloutPool


@dataclass
class PoolDrill:
    steps: int
    batch: int
    lose: list[int] = field(default_factory=list)  # positions whose group loses a sample (not kept)
    counts_the_step_taken: bool = True


@workflow.defn
class PoolDrillWorkflow:
    """Takes `steps` steps from a pool as the training workflow does: `steps_left` counts the
    steps after the one being taken (StepCollection moves its next step on before it takes)."""

    @workflow.run
    async def run(self, drill: PoolDrill) -> list[list[int]]:
        claimed = 0
        next_take = 0

        def claim() -> int:
            nonlocal claimed
            claimed += 1
            return claimed - 1

        async def start(position: int, version: int) -> RolloutOutput:
            await workflow.sleep(0.05 * (1 + position % 3))  # groups finish out of order
            lost = position in drill.lose
            return RolloutOutput(position, [str(position)], keep=not lost, samples=2, errors=int(lost),
                                 failed=int(lost), filter_reason="failed_samples" if lost else None)

        pool = RolloutPool(PoolConfig(drill.batch, drill.batch, max_staleness=1), start, claim,
                           lambda: drill.steps - next_take, lambda: 0,
                           counts_the_step_taken=drill.counts_the_step_taken)
        taken = []
        for step in range(drill.steps):
            next_take = step + 1
            step_groups = await pool.take()
            taken.append([g.position for g in step_groups.groups])
            pool.synced()
        await pool.cancel()
        return taken


async def drill(temporal_env, spec: PoolDrill, timeout: float = 60) -> list[list[int]]:
    queue = f"pool-{uuid.uuid4().hex}"
    async with Worker(temporal_env.client, task_queue=queue, workflows=[PoolDrillWorkflow],
                      workflow_runner=UnsandboxedWorkflowRunner()):
        return await temporal_env.client.execute_workflow(
            PoolDrillWorkflow.run, spec, id=queue, task_queue=queue, result_type=list[list[int]],
            execution_timeout=timedelta(seconds=timeout))


@pytest.mark.parametrize("lose", [[], [2, 3], [0, 1, 2, 3], [1, 3, 4, 5, 6, 7]],
                         ids=["none", "the-last-steps-groups", "every-first-group", "a-long-row"])
async def test_every_step_gets_its_batch_whichever_groups_lose_a_sample(temporal_env, lose):
    taken = await drill(temporal_env, PoolDrill(steps=2, batch=2, lose=lose))
    assert [len(groups) for groups in taken] == [2, 2], taken
    positions = [p for groups in taken for p in groups]
    assert len(set(positions)) == 4 and not set(positions) & set(lose), taken


async def test_the_refill_that_did_not_count_the_step_taken_waits_forever_on_the_last_step(temporal_env):
    """What a drill found (fully async, a reward failing 1 sample in 12): the last step's two lost
    groups were never replaced and the run hung with nothing in flight. Kept for the histories
    recorded before the fix, which replay it (`POOL_TAKE_PATCH`)."""
    with pytest.raises(WorkflowFailureError) as failed:
        await drill(temporal_env, PoolDrill(steps=2, batch=2, lose=[2, 3], counts_the_step_taken=False), timeout=4)
    assert "timed out" in str(failed.value.cause).lower(), failed.value.cause
