"""What every group workflow does around its environment's own steps: fan out one rollout per
sample, and finish the group (its final status and reward as search attributes, its preview in
the memo for the Web UI, the preview taken off what goes back to the training workflow). A
per-sample rollout workflow ends with `finish_rollout`: its own status, reward and preview.

    @workflow.defn(name="MyGroupWorkflow")
    class MyGroupWorkflow:
        @workflow.run
        async def run(self, inp: GroupInput) -> GroupOutput:
            outs = await fan_out_children(inp, MyRolloutWorkflow.run, lambda i: MyRolloutInput(...), "my")
            return finish_group(summarize_mine(inp.position, outs))

A rollout that is one activity (its turns checkpointed in the store) fans out with
`fan_out_activities`; a group that is one activity runs with `execute_group_activity`. A rollout
workflow's store activity returns its samples' previews (`vime.envs.contract.sample_previews`);
`finish_rollout` puts them in its memo and hands them on, and the group gathers its rollouts'
(`gathered_previews`) for its own memo, so the Web UI shows the texts on either workflow.

Workflow code: call these from inside a workflow only. The training workflow starts every group
with its run, rollout id, policy version and status "running" (`starting_search_attributes`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError, ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from vime.envs.contract import PREVIEW_SAMPLES, GroupInput, GroupOutput
    from vime.temporal.activity_bounds import rollout_activity_options
    from vime.temporal.retry import CONFIG_ERROR, root_message
    from vime.temporal.search_attributes import EVAL, POLICY_VERSION, REWARD, ROLLOUT_ID, ROLLOUT_STATUS, RUN_ID

T = TypeVar("T")

MEMO_PREVIEW_PATCH = "memo-preview"  # groups recorded before the memo replay without it


def group_workflow_id(run_id: str, position: int) -> str:
    return f"{run_id}-rollout-{position}"


def sample_workflow_id(run_id: str, position: int, index: int) -> str:
    """The id of a group's `index`-th per-sample child workflow: stable, so a retried start never
    duplicates it."""
    return f"{run_id}-rollout-{position}-{index}"


def rollout_workflow_id(inp: GroupInput, index: int) -> str:
    """The id of the group's `index`-th per-sample child: `sample_workflow_id` in training; in an
    eval round the eval group's own id (workflows/eval_round.py) and the index, apart from the
    training rollouts of the same position and from other rounds and sets."""
    if inp.evaluation:
        return f"{inp.run_id}-eval{inp.step}-{inp.eval_set}-{inp.position}-{index}"
    return sample_workflow_id(inp.run_id, inp.position, index)


def starting_search_attributes(inp: GroupInput) -> TypedSearchAttributes:
    """What a group's workflow is searchable by from its start (given by the parent at start: no
    upsert, one visibility write fewer per group)."""
    return TypedSearchAttributes([
        RUN_ID.value_set(inp.run_id),
        ROLLOUT_ID.value_set(str(inp.position)),
        POLICY_VERSION.value_set(inp.weight_version),
        ROLLOUT_STATUS.value_set("running"),
    ])


async def fan_out(inp: GroupInput, one: Callable[[int], Awaitable[T]]) -> list[T]:
    """`one(i)` for every sample of the group (`inp.n_samples_per_prompt`), concurrently, in order."""
    return list(await asyncio.gather(*(one(i) for i in range(inp.n_samples_per_prompt))))


async def fan_out_children(inp: GroupInput, run: Callable[..., Any], make_input: Callable[[int], Any],
                           what: str) -> list[Any]:
    """One child workflow (`run`, e.g. `MyRolloutWorkflow.run`) per sample, with id
    `rollout_workflow_id`. A child that failed for good (its infra failures retry or are stored
    inside it) fails the group with a non-retryable `ConfigError` naming the rollout and the root
    cause; a cancellation goes on as one."""
    # an eval rollout is found with its round's groups: VimeEval=true (training's children: as before)
    tagged = {"search_attributes": TypedSearchAttributes(
        [*starting_search_attributes(inp).search_attributes, EVAL.value_set(True)])} if inp.evaluation else {}

    async def one(i: int) -> Any:
        try:
            return await workflow.execute_child_workflow(run, make_input(i), id=rollout_workflow_id(inp, i), **tagged)
        except ChildWorkflowError as e:
            if is_cancelled_exception(e):  # the run is being cancelled
                raise
            raise ApplicationError(f"{what} rollout {inp.position}-{i} failed: {root_message(e)}",
                                   type=CONFIG_ERROR, non_retryable=True) from e

    return await fan_out(inp, one)


async def fan_out_activities(inp: GroupInput, name: str, make_input: Callable[[int], Any], result_type: type[T],
                             timeout: timedelta = timedelta(hours=2)) -> list[T]:
    """One activity `name` per sample (`make_input(i)` its input, `result_type` its output),
    concurrently, each heartbeating, with the rollout retry policy: the per-sample sibling of
    `execute_group_activity` (a long rollout as one activity that checkpoints its turns)."""
    return await fan_out(inp, lambda i: workflow.execute_activity(
        name, make_input(i), result_type=result_type, **rollout_activity_options(inp.heartbeat_seconds, timeout)))


async def execute_group_activity(inp: GroupInput, name: str, timeout: timedelta = timedelta(hours=2)) -> GroupOutput:
    """The activity `name` on the whole group (`GroupInput` in, `GroupOutput` out), heartbeating,
    with the rollout retry policy (infra failures retry, a `ConfigError` ends the run)."""
    return await workflow.execute_activity(name, inp, result_type=GroupOutput,
                                           **rollout_activity_options(inp.heartbeat_seconds, timeout))


def finish_group(out: GroupOutput, status: str | None = None) -> GroupOutput:
    """The group's final status (`status`, default `out.status`) and mean reward as search
    attributes; its preview (if the activity made one) in the memo, then off `out`."""
    updates = [ROLLOUT_STATUS.value_set(status or out.status)]
    if out.reward_mean is not None:
        updates.append(REWARD.value_set(out.reward_mean))
    workflow.upsert_search_attributes(updates)
    show_samples(out.preview)
    out.preview = None
    return out


def finish_rollout(status: str, reward: float | None, preview: list[dict] | None, *more: Any) -> None:
    """A per-sample rollout workflow's end: its status and reward (`Reward`: the rollout's, the
    mean over its samples for a fan-out) and `more` search attribute updates, then its samples'
    preview in its memo. The preview stays in its output: the group gathers it."""
    updates = [ROLLOUT_STATUS.value_set(status), *more]
    if reward is not None:
        updates.append(REWARD.value_set(reward))
    workflow.upsert_search_attributes(updates)
    show_samples(preview)


def show_samples(preview: list[dict] | None) -> None:
    """The samples' previews in this workflow's memo (`samples`), where the Web UI shows them;
    nothing for None. A workflow recorded before previews replays without the memo."""
    if preview is not None and workflow.patched(MEMO_PREVIEW_PATCH):
        workflow.upsert_memo({"samples": preview[:PREVIEW_SAMPLES]})


def gathered_previews(outs: list[Any]) -> list[dict] | None:
    """The previews a group's rollouts returned (`preview` of each output), in order; None for none."""
    found = [p for o in outs for p in (getattr(o, "preview", None) or [])]
    return found[:PREVIEW_SAMPLES] or None
