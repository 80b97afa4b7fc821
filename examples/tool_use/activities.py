"""The tool-use environment's activities (rollout queue): one rollout, and storing a group.

Heavy imports (the sandbox, the tokenizer, the engine client) happen here, in the worker, never
in the module the flag parser imports (`env.py`).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from activities.errors import final_config_errors
from activities.heartbeat import heartbeating
from activities.store_calls import store_call
from examples.tool_use.flags import tool_use_config
from examples.tool_use.rollout import TurnLog, replay, reward, run_tool_rollout
from examples.tool_use.tool import tool_sandbox
from examples.tool_use.workflow import ToolUseRolloutInput, ToolUseRolloutOutput
from vime.envs.base import EnvContext, EnvWorkers, GroupInput, GroupOutput
from vime.envs.rollouts import prompt_group, store_group, stored_group
from vime.errors import ConfigError
from vime.rollout.generate import get_engine_client, prompt_token_ids
from vime.rollout.sampling import params_for_sample, sampling_params_from_args
from vime.rollout.tokenization import tokenizer_for
from vime.types import Sample


class ToolUseActivities:
    """`engine(args)` gives what `generate(ids, params, session_id=...)` is called on: the run's
    vLLM router by default (`vime.testing.scripted.ScriptedEngine` in tests that script a policy)."""

    def __init__(self, ctx: EnvContext, engine: Any = None) -> None:
        self.args, self.store = ctx.args, ctx.store
        self.engine = engine or get_engine_client

    async def _fresh(self, position: int, index: int) -> Sample:
        group = await prompt_group(self.args, position)
        if not 0 <= index < len(group):
            raise ConfigError(f"sample {index} of prompt group {position}: the group has {len(group)}")
        sample = group[index]
        sample.tokens = prompt_token_ids(self.args, sample)
        return sample

    @activity.defn(name="tool_use_rollout")
    @final_config_errors
    async def tool_use_rollout(self, inp: ToolUseRolloutInput) -> ToolUseRolloutOutput:
        sample = await self._fresh(inp.position, inp.index)
        rid = str(sample.index)
        turn_log = TurnLog(self.store, inp.run_id, rid)
        config = tool_use_config(self.args)
        engine = self.engine(self.args)
        session = f"{inp.run_id}-{rid}"

        async def generate(ids: list[int], params: dict) -> Any:
            return await engine.generate(ids, params, session_id=session)

        async with heartbeating(), tool_sandbox(self.args.sandbox_backend, config.limits) as sandbox:
            sample = await run_tool_rollout(
                sample, generate=generate, tokenizer=tokenizer_for(self.args), sandbox=sandbox,
                params=params_for_sample(sampling_params_from_args(self.args), self.args, sample),
                config=config, turn_log=turn_log, on_turn=activity.heartbeat)
        turns = sample.metadata.get("turns", [])
        return ToolUseRolloutOutput(rid, len(turns), sample.metadata["tool_calls"], sample.metadata["resumed_at"])

    @activity.defn(name="store_tool_use_group")
    @final_config_errors
    async def store_tool_use_group(self, inp: GroupInput) -> GroupOutput:
        group = await prompt_group(self.args, inp.position)
        ids = [str(s.index) for s in group]
        if (done := await stored_group(self.store, inp, ids)) is not None:  # a retry after the write
            return done
        rollouts = {}
        for rid, base in zip(ids, group):
            sample = await self._fresh(inp.position, base.index - group[0].index)
            sample.response_length, sample.loss_mask, sample.rollout_log_probs = 0, [], []
            turns = await store_call(TurnLog(self.store, inp.run_id, rid).read)
            if not turns:
                raise ConfigError(f"tool_use: rollout {rid} of group {inp.position} has no stored turn")
            replay(sample, turns)
            sample.metadata["tool_calls"] = sum(1 for t in sample.metadata["turns"] if t["observation"])
            sample.metadata["env"] = "tool_use"
            sample.reward = reward(sample)
            rollouts[rid] = [sample]
        return await store_group(self.store, inp, rollouts)


def start(ctx: EnvContext) -> EnvWorkers:
    acts = ToolUseActivities(ctx)
    return EnvWorkers(activities=[acts.tool_use_rollout, acts.store_tool_use_group])
