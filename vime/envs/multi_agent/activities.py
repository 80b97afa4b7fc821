"""The activities of MultiAgentRolloutWorkflow (rollout queue): one per role, and the store.

A role activity checkpoints what it sampled in the store's turn table before it returns, so
it is idempotent on the rollout: a retry finds the role's turns stored and returns them
without sampling (the solvers, sampled concurrently and stored in order, keep those stored
before a crash and sample only the rest). Every turn's `meta` records which activity attempt
and worker sampled it (`sampled_by`, `worker`: `vime.envs.sampled_here`): a role is never
sampled twice into the store, and `vime show` tells a role a retry sampled.

Every store call runs in a thread (`store_call`): a write waiting for SQLite's lock must not stop
the worker's event loop, which sends the heartbeats.

The grader is two hooks, not methods to override: `start(ctx, score=..., reward=...)` builds the
same environment around another verifier (`score(args, turn) -> float`, each solver's and the
rewriter's turn) or another payout (`reward(args, turns) -> [float]`, one per turn of a rollout,
in turn order); both may be async (`vime.envs.multi_agent.task` has the defaults).
"""

from __future__ import annotations

from typing import Any

from temporalio import activity

from vime.envs import (EnvContext, EnvWorkers, check_policy, final_config_errors, group_args, heartbeating,
                       heartbeats_throughout, prompt_group, sample_previews, sampled_here, sampling_params,
                       store_call, store_rollout)
from vime.envs.multi_agent import roles, task
from vime.envs.multi_agent.flags import multi_agent_flags
from vime.envs.multi_agent.workflow import (REWRITER, SELECTOR, SOLVERS, STORE, MultiAgentRolloutInput,
                                           MultiAgentRolloutOutput, RoleOutput)
from vime.store.queries import Turn
from vime.types import RolloutRef, Sample

_ARRAYS = ("tokens", "loss_mask", "rollout_log_probs")


def turn_record(sample: Sample) -> dict[str, Any]:
    """`store.append_turn`'s arguments for a role's sampled turn: the whole sequence, the mask
    and logprobs over it (0 on the prompt), the rest of the Sample as `meta`."""
    prompt = sample.prompt_length
    meta = {k: v for k, v in sample.to_dict().items() if k not in _ARRAYS}
    return {"turn": sample.metadata["turn"], "token_ids": list(sample.tokens),
            "loss_mask": [0] * prompt + list(sample.loss_mask or [1] * sample.response_length),
            "log_probs": [0.0] * prompt + list(sample.rollout_log_probs or [0.0] * sample.response_length),
            "meta": {"sample": meta, "prompt_length": prompt}}


def turn_sample(turn: Turn) -> Sample:
    """The Sample a stored turn was made from."""
    prompt = turn.meta["prompt_length"]
    return Sample.from_dict({**turn.meta["sample"], "tokens": turn.token_ids, "loss_mask": turn.loss_mask[prompt:],
                             "rollout_log_probs": (turn.log_probs or [])[prompt:]})


class MultiAgentActivities:
    """Each activity works for the run its input names, with that run's config (`ctx.run_args`);
    `score` and `reward` are the grader's hooks (`start`)."""

    def __init__(self, ctx: EnvContext, *, score: task.Score = task.score, reward: task.Reward = task.reward) -> None:
        self.ctx, self.store, self.score, self.reward = ctx, ctx.store, score, reward

    async def _base(self, inp: MultiAgentRolloutInput) -> tuple[Any, Sample, dict[str, Any]]:
        """The run's args, the rollout's sample (a training or an eval prompt's, its `rollout_id`
        the store's key) and its sampling parameters (seeded by its index)."""
        args = await self.ctx.run_args(inp.run_id)
        base = (await prompt_group(args, inp))[inp.index]
        base.session_id = f"{inp.run_id}-{base.rollout_id}"
        return group_args(args, inp), base, sampling_params(args, inp, base)

    async def _stored(self, inp: MultiAgentRolloutInput, base: Sample) -> dict[int, Sample]:
        turns = await store_call(self.store.read_turns, inp.run_id, base.rollout_id)
        return {t.turn: turn_sample(t) for t in turns}

    async def _save(self, inp: MultiAgentRolloutInput, base: Sample, samples: list[Sample]) -> None:
        """The role's turns, checked against the rollout's policy version first (a turn from the
        wrong weights is not stored: the retried role samples it again)."""
        check_policy(samples, inp, f"rollout {base.rollout_id}")
        here = sampled_here()
        for s in sorted(samples, key=lambda s: s.metadata["turn"]):
            s.metadata.update(here)
            await store_call(self.store.append_turn, inp.run_id, base.rollout_id, **turn_record(s))

    def _output(self, role: str, base: Sample, samples: list[Sample]) -> RoleOutput:
        return RoleOutput(role, base.rollout_id, [s.metadata["turn"] for s in samples],
                          [float(s.metadata["score"]) for s in samples], sum(task.usable(s) for s in samples),
                          samples[-1].metadata.get("pick") if role == "selector" else None,
                          ",".join(sorted({s.metadata.get("sampled_by", "") for s in samples})))

    @activity.defn(name=SOLVERS)
    @final_config_errors  # a ConfigError ends the run with its line; the rest retries
    @heartbeats_throughout
    async def solvers(self, inp: MultiAgentRolloutInput) -> RoleOutput:
        args, base, params = await self._base(inp)
        k = multi_agent_flags(args).num_solvers
        done = {t: s for t, s in (await self._stored(inp, base)).items() if t < k}
        if len(done) < k:
            async with heartbeating():
                turns = await roles.solvers(args, base, params, k, done, score=self.score)
            await self._save(inp, base, [s for s in turns if s.metadata["turn"] not in done])
            done = {s.metadata["turn"]: s for s in turns}
        return self._output("solver", base, [done[t] for t in range(k)])

    async def _one_turn(self, inp: MultiAgentRolloutInput, role: str, after_solvers: int, sample) -> RoleOutput:
        """A role of one turn, `after_solvers` turns after the K solvers' (the rewriter 0, the
        selector 1): `sample(args, base, params, solutions, stored)` once, stored; a retry reads it back."""
        args, base, params = await self._base(inp)
        k = multi_agent_flags(args).num_solvers
        stored, turn = await self._stored(inp, base), k + after_solvers
        if turn not in stored:
            async with heartbeating():
                stored[turn] = await sample(args, base, params, [stored[t] for t in range(k)], stored)
            await self._save(inp, base, [stored[turn]])
        return self._output(role, base, [stored[turn]])

    @activity.defn(name=REWRITER)
    @final_config_errors
    @heartbeats_throughout
    async def rewriter(self, inp: MultiAgentRolloutInput) -> RoleOutput:
        return await self._one_turn(inp, "rewriter", 0, lambda args, base, params, solutions, _: roles.rewriter(
            args, base, params, solutions, score=self.score))

    @activity.defn(name=SELECTOR)
    @final_config_errors
    @heartbeats_throughout
    async def selector(self, inp: MultiAgentRolloutInput) -> RoleOutput:
        return await self._one_turn(inp, "selector", 1, lambda args, base, params, solutions, stored: roles.selector(
            args, base, params, solutions, stored[len(solutions)]))  # the rewriter's turn

    @activity.defn(name=STORE)
    @final_config_errors
    @heartbeats_throughout
    async def store_rollout(self, inp: MultiAgentRolloutInput) -> MultiAgentRolloutOutput:
        """The stored turns as the rollout's samples, rewarded, written once (a retry gets the
        stored refs back)."""
        args, base, _ = await self._base(inp)
        rollout_id = base.rollout_id
        stored = await self._stored(inp, base)
        samples = [stored[t] for t in sorted(stored)]
        correct = await roles.pay(self.reward, args, samples)
        for s in samples:
            s.metadata["weight_version"] = inp.weight_version
        refs = await store_rollout(self.store, inp, rollout_id, samples)
        return MultiAgentRolloutOutput(RolloutRef(inp.run_id, rollout_id, refs, inp.weight_version),
                                       sum(s.reward for s in samples) / len(samples), correct,
                                       [s.metadata["role"] for s in samples], sample_previews([rollout_id], [samples]))

    def all(self) -> list:
        return [self.solvers, self.rewriter, self.selector, self.store_rollout]


def start(ctx: EnvContext, *, score: task.Score = task.score, reward: task.Reward = task.reward) -> EnvWorkers:
    return EnvWorkers(activities=MultiAgentActivities(ctx, score=score, reward=reward).all())

