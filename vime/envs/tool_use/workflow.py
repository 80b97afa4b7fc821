"""ToolUseGroupWorkflow: one prompt group of tool-use rollouts, each resumable per turn.

    GroupInput → tool_use_rollout × n (in parallel, each heartbeating, its turns stored as they
                 finish) → store_tool_use_group (rebuild from the stored turns, reward, store once)
               → GroupOutput

A rollout is one activity that loops over turns (sample, run the code in a sandbox, splice the
output) and appends each finished turn to the store; its sandbox lives and dies inside the
activity, so any worker can retry it. A worker killed mid-rollout stops heartbeating, Temporal
retries the activity elsewhere, and the retry replays the stored turns and continues at the
first turn not stored (`rollout.py`). Infra failures (engine down, sandbox
that cannot start) retry until they pass; a `ConfigError` (a bad label, a broken prompt) ends
the run with its line. What the model's code does is never a failure: it is an observation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from vime.envs import GroupInput, GroupOutput
    from vime.envs.group_workflow import execute_group_activity, fan_out_activities, finish_group

TOOL_USE_ROLLOUT = "tool_use_rollout"
STORE_TOOL_USE_GROUP = "store_tool_use_group"


@dataclass
class ToolUseRolloutInput:
    run_id: str
    position: int  # the prompt group
    index: int  # which sample of the group (0..n-1)
    weight_version: int
    step: int = 0  # the group's (an eval group's round)
    evaluation: bool = False  # an eval prompt's sample (see GroupInput)
    eval_set: str | None = None


@dataclass
class ToolUseRolloutOutput:
    rollout_id: str
    turns: int
    tool_calls: int
    resumed_at: int  # turns an earlier attempt had stored (0: a first attempt)


@workflow.defn(name="ToolUseGroupWorkflow")
class ToolUseGroupWorkflow:
    @workflow.run
    async def run(self, inp: GroupInput) -> GroupOutput:
        await fan_out_activities(inp, TOOL_USE_ROLLOUT, lambda i: ToolUseRolloutInput(
            inp.run_id, inp.position, i, inp.weight_version, inp.step, inp.evaluation, inp.eval_set),
            ToolUseRolloutOutput)
        return finish_group(await execute_group_activity(inp, STORE_TOOL_USE_GROUP, timedelta(minutes=10)))
