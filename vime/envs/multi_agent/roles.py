"""The roles' turns, sampled with vime's default generate: the one place that talks to vLLM,
for both the durable environment (one activity per role) and the generate hook (all in one call).

Each turn is a fresh `Sample` on its role's prompt (token ids in, the sampled ids and logprobs
out, exactly as vLLM returned them); `metadata` tags it with its `role` and `slot` and holds its
verifier `score` (the `score` hook's). Turn `t` of a rollout (solvers 0..K-1, the rewriter K, the
selector K+1) is seeded from the rollout's seed and `t`, so a retried role asks vLLM for the same
draws. `pay` turns a rollout's scored turns into rewards (the `reward` hook).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

from vime.envs.multi_agent import task
from vime.errors import ConfigError, ServiceError
from vime.plugins import call_hook_async
from vime.rollout.generate import generate
from vime.rollout.tokenization import tokenizer_for
from vime.types import Sample

_SEED_MOD = 2**63


def turn_seed(params: dict[str, Any], turn: int) -> dict[str, Any]:
    """`params` with the seed of turn `turn` (the rollout's seed spread over its turns)."""
    params = dict(params)
    if params.get("seed") is not None:
        params["seed"] = (int(params["seed"]) * 1_000_003 + turn) % _SEED_MOD
    return params


async def generate_turn(args: Any, base: Sample, role: str, slot: int, turn: int,
                        messages: list[dict[str, str]], sampling_params: dict[str, Any],
                        score: task.Score | None = task.score) -> Sample:
    """One turn of `role`, scored by `score` (None: the caller scores it). An aborted request (the
    engine paused for a weight sync) is an infrastructure failure: raised, so the role is generated
    again."""
    sample = Sample(group_index=base.group_index, index=base.index, prompt=messages, label=base.label,
                    session_id=base.session_id, metadata={"role": role, "slot": slot, "turn": turn})
    sample = await generate(args, sample, turn_seed(sampling_params, turn))
    if sample.status == Sample.Status.ABORTED:
        raise ServiceError(f"the engine aborted the {role} turn {turn} of sample {base.index}")
    if score is not None:
        sample.metadata["score"] = _number(await call_hook_async(score, args, sample), "score", score)
    return sample


async def pay(reward: task.Reward, args: Any, samples: list[Sample]) -> bool:
    """Set every turn's reward from the `reward` hook (one number per turn, in order); returns
    whether the final answer is correct (`metadata["final_correct"]`, which the default sets)."""
    rewards = list(await call_hook_async(reward, args, samples))
    if len(rewards) != len(samples):
        raise ConfigError(f"multi_agent reward hook {_name(reward)}: returned {len(rewards)} rewards for "
                          f"{len(samples)} turns; return one per turn, in turn order")
    for s, r in zip(samples, rewards):
        s.reward = _number(r, "reward", reward)
    return bool(samples) and bool(samples[-1].metadata.get("final_correct"))


def _number(value: Any, what: str, hook: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"multi_agent {what} hook {_name(hook)}: returned {value!r}; return a finite number")
    return float(value)


def _name(hook: Any) -> str:
    return f"{getattr(hook, '__module__', '?')}.{getattr(hook, '__qualname__', repr(hook))}"


def replies(args: Any, samples: Sequence[Sample]) -> list[str]:
    tokenizer = tokenizer_for(args)
    return [task.clean_text(tokenizer, s.response) for s in samples]


async def solvers(args: Any, base: Sample, params: dict[str, Any], k: int,
                  done: dict[int, Sample] | None = None, score: task.Score = task.score) -> list[Sample]:
    """The K solver turns, sampled concurrently; `done` holds turns already sampled (kept)."""
    done = dict(done or {})
    problem = task.problem_text(base.prompt)
    missing = [i for i in range(k) if i not in done]
    sampled = await asyncio.gather(*(generate_turn(args, base, "solver", i, i, task.solver_prompt(problem), params,
                                                   score) for i in missing))
    done.update(zip(missing, sampled))
    return [done[i] for i in range(k)]


def candidates(solver_turns: Sequence[Sample], rewrite: Sample | None) -> list[Sample]:
    """What the selector chooses among: the usable drafts, then the rewrite if usable."""
    return [s for s in [*solver_turns, *([rewrite] if rewrite else [])] if task.usable(s)]


async def rewriter(args: Any, base: Sample, params: dict[str, Any], solver_turns: Sequence[Sample],
                   score: task.Score = task.score) -> Sample:
    drafts = [s for s in solver_turns if task.usable(s)]
    messages = task.rewriter_prompt(task.problem_text(base.prompt), replies(args, drafts))
    return await generate_turn(args, base, "rewriter", 0, len(solver_turns), messages, params, score)


async def selector(args: Any, base: Sample, params: dict[str, Any], solver_turns: Sequence[Sample],
                   rewrite: Sample | None) -> Sample:
    """The selector's turn; its `score` is the score of the candidate it picked (0 for none; the
    `score` hook is not asked), `metadata["pick"]` names it (`"A"`..., or None) and `picked_turn`
    is that candidate's turn."""
    pool = candidates(solver_turns, rewrite)
    messages = task.selector_prompt(task.problem_text(base.prompt), replies(args, pool))
    turn = len(solver_turns) + 1
    sample = await generate_turn(args, base, "selector", 0, turn, messages, params, score=None)
    pick = task.parse_pick(task.clean_text(tokenizer_for(args), sample.response), len(pool)) \
        if task.usable(sample) else None
    sample.metadata["pick"] = None if pick is None else task.LABELS[pick]
    sample.metadata["picked_turn"] = None if pick is None else pool[pick].metadata["turn"]
    sample.metadata["score"] = 0.0 if pick is None else pool[pick].metadata["score"]
    return sample
