"""The tool-use environment's activities (rollout queue): one rollout, and storing a group.

Its reward and its tool are hooks: `start(ctx, reward=..., tool=...)` builds the same
environment around another grader (`reward(sample) -> float`) or another tool (`tool(sandbox,
code, limits) -> CodeRun`), with no subclass. Heavy imports (the sandbox, the tokenizer, the
engine client) happen here, in the worker, never in the module the flag parser imports (the package's `__init__`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from temporalio import activity

from vime.envs import (EnvContext, EnvWorkers, GroupInput, GroupOutput, TurnLog, final_config_errors, group_args,
                       heartbeating, heartbeats_throughout, prompt_group, prompt_sample, sampling_params, store_group, stored_group)
from vime.envs.tool_use.flags import tool_use_config
from vime.envs.tool_use.rollout import Tool, replay, reward, run_tool_rollout
from vime.envs.tool_use.tool import run_code, tool_sandbox
from vime.envs.tool_use.workflow import ToolUseRolloutInput, ToolUseRolloutOutput
from vime.errors import ConfigError
from vime.rollout.generate import get_engine_client
from vime.rollout.tokenization import tokenizer_for


class ToolUseActivities:
    """`engine(args)` gives what `generate(ids, params, session_id=...)` is called on: the run's
    vLLM router by default (`vime.testing.scripted.ScriptedEngine` in tests that script a policy)."""

    def __init__(self, ctx: EnvContext, engine: Any = None, reward: Callable[[Any], float] = reward,
                 tool: Tool = run_code) -> None:
        self.ctx, self.store, self.reward, self.tool = ctx, ctx.store, reward, tool
        self.engine = engine or get_engine_client

    @activity.defn(name="tool_use_rollout")
    @final_config_errors
    @heartbeats_throughout
    async def tool_use_rollout(self, inp: ToolUseRolloutInput) -> ToolUseRolloutOutput:
        args = await self.ctx.run_args(inp.run_id)
        sample = await prompt_sample(args, inp)
        args = group_args(args, inp)  # an eval set's own settings (--eval-config)
        rid, config, engine = sample.rollout_id, tool_use_config(args), self.engine(args)

        async def generate(ids: list[int], params: dict) -> Any:
            return await engine.generate(ids, params, session_id=f"{inp.run_id}-{rid}")

        async with heartbeating(), tool_sandbox(args.sandbox_backend, config.limits) as sandbox:
            sample = await run_tool_rollout(
                sample, generate=generate, tokenizer=tokenizer_for(args), sandbox=sandbox,
                params=sampling_params(args, inp, sample), config=config,
                turn_log=TurnLog(self.store, inp.run_id, rid, inp), on_turn=activity.heartbeat, tool=self.tool)
        meta = sample.metadata
        return ToolUseRolloutOutput(rid, len(meta.get("turns", [])), meta["tool_calls"], meta["resumed_at"])

    @activity.defn(name="store_tool_use_group")
    @final_config_errors
    @heartbeats_throughout
    async def store_tool_use_group(self, inp: GroupInput) -> GroupOutput:
        args = await self.ctx.run_args(inp.run_id)
        ids = [s.rollout_id for s in await prompt_group(args, inp)]
        if (done := await stored_group(self.store, inp, ids)) is not None:  # a retry after the write
            return done
        rollouts = {}
        async with heartbeating():  # the group workflow waits on its heartbeats (`execute_group_activity`)
            for index, rid in enumerate(ids):
                sample = await prompt_sample(args, inp, index)
                if not (turns := await TurnLog(self.store, inp.run_id, rid).read()):
                    raise ConfigError(f"tool_use: rollout {rid} of group {inp.position} has no stored turn")
                sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
                replay(sample, turns)
                sample.metadata["tool_calls"] = sum(1 for t in sample.metadata["turns"] if t["observation"])
                sample.metadata["env"] = "tool_use"
                sample.reward = self.reward(sample)
                rollouts[rid] = [sample]
            return await store_group(self.store, inp, rollouts, preview=True)


def start(ctx: EnvContext, *, reward: Callable[[Any], float] = reward, tool: Tool = run_code) -> EnvWorkers:
    acts = ToolUseActivities(ctx, reward=reward, tool=tool)
    return EnvWorkers(activities=[acts.tool_use_rollout, acts.store_tool_use_group])
