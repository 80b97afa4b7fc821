"""The toy task, its role prompts and its verifier: pure functions, shared by the durable
environment and the generate hook.

The task is the quickstart's, made a team's: answer in capitals. A response's *score* is the
share of its tokens that contain a capital letter (a random tiny model scores ~0.23), and an
answer is *correct* when its score reaches `CORRECT_AT`. Cheap to verify, far from solved at
step 0, and learnable by the tiny model on CPU in a few dozen steps.

The roles, all played by the same policy:

- K solvers get the problem and draft an answer each;
- the rewriter gets the problem and the solvers' drafts and writes one answer;
- the selector gets the drafts and the rewrite as candidates labeled A, B, ... and names one.
  Its pick is the first candidate label (a capital letter) in its reply, so writing capitals
  and naming a candidate go together; a reply with no label picks nothing.

Rewards (`assign_rewards`): each solver and the rewriter get their own score, the selector the
score of the candidate it picked (0 without a pick); then every role's reward is multiplied by
`--correct-reward-weight` when the picked candidate is correct, else by
`--incorrect-reward-weight` (slime's weighting). Siblings therefore carry rewards of their own;
the advantage code counts the rollout once in its group's statistics whatever its fan-out.

`score` and `reward` are the environment's default hooks (`activities.start(ctx, score=...,
reward=...)` takes others): a turn's verifier score, and a rollout's turns paid from their scores.
"""

from __future__ import annotations

import string
from collections.abc import Awaitable, Callable, Sequence
from functools import lru_cache
from typing import Any

from vime.envs.multi_agent.flags import multi_agent_flags
from vime.rollout.tokenization import tokenizer_for
from vime.types import Sample

CORRECT_AT = 0.5
ROLES = ("solver", "rewriter", "selector")
LABELS = string.ascii_uppercase

# The hooks (sync or async): a role turn's verifier score, and one reward per turn of a rollout.
Score = Callable[[Any, Sample], "float | Awaitable[float]"]  # (args, turn) -> its score
Reward = Callable[[Any, list[Sample]], "Sequence[float] | Awaitable[Sequence[float]]"]  # (args, turns in order)


def problem_text(prompt: str | list[dict[str, Any]]) -> str:
    """The problem statement of a data-source prompt: the text, or the last user message's."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if m.get("role") == "user"]
    return str(users[-1] if users else "")


def solver_prompt(problem: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"Solve: {problem}"}]


def rewriter_prompt(problem: str, drafts: Sequence[str]) -> list[dict[str, str]]:
    listed = "\n".join(f"Draft {i + 1}: {d}" for i, d in enumerate(drafts))
    return [{"role": "user", "content": f"Problem: {problem}\n{listed}\nRewrite them into one better answer."}]


def selector_prompt(problem: str, candidates: Sequence[str]) -> list[dict[str, str]]:
    listed = "\n".join(f"{LABELS[i]}) {c}" for i, c in enumerate(candidates))
    return [{"role": "user", "content": f"Problem: {problem}\nCandidates:\n{listed}\n"
                                        f"Answer with the letter of the best candidate."}]


def parse_pick(reply: str, candidates: int) -> int | None:
    """The candidate the selector named: the first of the labels A.. (as many as there are
    candidates) that occurs in its reply; None when it names none."""
    labels = LABELS[:candidates]
    return next((labels.index(c) for c in reply if c in labels), None)


@lru_cache(maxsize=4)
def _capital_table(tokenizer: Any) -> tuple[bool, ...]:
    return tuple(any(c.isupper() for c in tokenizer.decode([i])) for i in range(len(tokenizer)))


def capital_share(tokenizer: Any, response_ids: Sequence[int]) -> float:
    """The score: the share of response tokens whose text holds a capital letter."""
    if not response_ids:
        return 0.0
    table = _capital_table(tokenizer)
    return sum(table[t] for t in response_ids if t < len(table)) / len(response_ids)


def clean_text(tokenizer: Any, text: str) -> str:
    """A reply as the next role reads it: without the tokenizer's control tokens (a reply that
    ends in `<|im_end|>` must not end the next role's prompt early)."""
    for special in tokenizer.all_special_tokens:
        text = text.replace(special, "")
    return " ".join(text.split())


def usable(sample: Sample) -> bool:
    """A turn the next role can build on: it sampled something and did not fail."""
    return sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and sample.response_length > 0


def assign_rewards(samples: Sequence[Sample], correct_weight: float, incorrect_weight: float) -> bool:
    """Set every role sample's reward from its `metadata["score"]` and the system's outcome;
    returns whether the final answer is correct.

    The outcome is the selector's: its score is the picked candidate's, so the system is correct
    when that reaches `CORRECT_AT`. A rollout that ended before the selector (no usable draft)
    has no final answer: incorrect."""
    selector = [s for s in samples if s.metadata.get("role") == "selector"]
    correct = bool(selector) and selector[-1].metadata.get("score", 0.0) >= CORRECT_AT
    weight = correct_weight if correct else incorrect_weight
    for s in samples:
        s.reward = float(s.metadata.get("score", 0.0)) * weight
        s.metadata["final_correct"] = correct
        s.metadata["reward_weight"] = weight
    return correct


def score(args: Any, sample: Sample) -> float:
    """The default `score` hook: the capital share of the turn's response (the run's tokenizer)."""
    return capital_share(tokenizer_for(args), sample.response_tokens)


def reward(args: Any, samples: list[Sample]) -> list[float]:
    """The default `reward` hook: `assign_rewards` with the run's --correct-/--incorrect-reward-weight."""
    flags = multi_agent_flags(args)
    assign_rewards(samples, flags.correct_reward_weight, flags.incorrect_reward_weight)
    return [s.reward for s in samples]
