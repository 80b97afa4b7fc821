"""The multi-agent system's flags, parsed into `args.env_args` when a run uses it
(`--rollout-env multi_agent`, or its generate hook `vime.envs.multi_agent.generate.generate`).

The two weights are slime's `correct_reward_weight` / `incorrect_reward_weight`: every role's
reward is its own score times one of them, chosen by whether the system's final answer (the
candidate the selector picked) is correct. A system that ends right pays all its roles more.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vime.envs.base import env_flag
from vime.errors import ConfigError

MAX_SOLVERS = 25  # the selector names candidates A..Z: K solvers and the rewrite


@dataclass
class MultiAgentFlags:
    num_solvers: int = env_flag(3, "Solvers per rollout (K): each drafts an answer; the rewriter sees them all.")
    correct_reward_weight: float = env_flag(
        1.2, "Multiplies every role's reward when the selector's pick is correct (slime's correct_reward_weight).")
    incorrect_reward_weight: float = env_flag(
        0.8, "Multiplies every role's reward when it is not (slime's incorrect_reward_weight).")


def check(args: Any) -> None:
    """One line naming the flag, before any service starts."""
    flags = multi_agent_flags(args)
    if not 1 <= flags.num_solvers <= MAX_SOLVERS:
        raise ConfigError(f"--num-solvers {flags.num_solvers}: must be between 1 and {MAX_SOLVERS} "
                          "(the selector names the candidates A..Z)")
    for name in ("correct_reward_weight", "incorrect_reward_weight"):
        value = getattr(flags, name)
        if not math.isfinite(value) or value < 0:
            raise ConfigError(f"--{name.replace('_', '-')} {value}: must be a finite number >= 0")
    if flags.incorrect_reward_weight > flags.correct_reward_weight:
        raise ConfigError(f"--incorrect-reward-weight {flags.incorrect_reward_weight} is above "
                          f"--correct-reward-weight {flags.correct_reward_weight}: a wrong final answer would pay "
                          "more than a right one")


def multi_agent_flags(args: Any) -> MultiAgentFlags:
    """The run's flags (their defaults for an `args` that parsed none, e.g. a test's namespace)."""
    flags = args.env_args
    return flags if isinstance(flags, MultiAgentFlags) else MultiAgentFlags()
