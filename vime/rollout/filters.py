"""Dynamic-sampling filters (DAPO style): keep or drop a finished prompt group.

A filter is slime's hook `filter(args, samples, **kwargs) -> DynamicFilterOutput` (`keep`,
`reason`), named by `--dynamic-sampling-filter-path`. `samples` holds one entry per rollout: a
`Sample`, or for a fan-out the list of its siblings (which share one reward), as slime passes
them. Older filters that return a plain bool work too.

Why drop groups at all: under GRPO a group whose rewards are all equal has zero advantage
everywhere, so it costs a train step's compute and teaches nothing.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError
from vime.plugins import call_hook, load_function
from vime.rollout.rewards import reward_value
from vime.types import Sample

__all__ = ["DynamicFilterOutput", "apply_dynamic_filter", "check_reward_nonzero_std", "rollout_entries"]


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None


def _first(entry: Sample | list[Sample]) -> Sample:
    return entry[0] if isinstance(entry, list) else entry


def _is_infra_failure(sample: Sample) -> bool:
    flag = (sample.metadata or {}).get("infra_failure")
    return bool(flag.strip()) if isinstance(flag, str) else bool(flag)


def check_reward_nonzero_std(args: Any, samples: list[Sample | list[Sample]], **kwargs: Any) -> DynamicFilterOutput:
    """Keep the group when its rollouts' rewards spread (std > 1e-6); infra failures do not count.

    `reason` on a drop is `zero_std_<reward>` (slime's form), or `too_few_rewards` when fewer
    than two rollouts have a reward.
    """
    rewards = []
    for entry in samples:
        sample = _first(entry)
        if _is_infra_failure(sample):
            continue
        value = reward_value(args, sample)
        if value is not None:
            rewards.append(value)
    if len(rewards) < 2:
        return DynamicFilterOutput(keep=False, reason="too_few_rewards")
    mean = math.fsum(rewards) / len(rewards)
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1))
    keep = std > 1e-6
    return DynamicFilterOutput(keep=keep, reason=None if keep else f"zero_std_{round(rewards[0], 1)}")


def rollout_entries(group: list[Sample] | list[list[Sample]]) -> list[Sample | list[Sample]]:
    """A group in the shape slime's filters take: a `Sample` per single-sample rollout, the sibling
    list per fan-out. Accepts `run_group`'s output (a list of sibling lists) or a flat list."""
    return [entry[0] if isinstance(entry, list) and len(entry) == 1 else entry for entry in group]


def apply_dynamic_filter(args: Any, group: list[Sample] | list[list[Sample]]) -> tuple[bool, str | None]:
    """`(keep, reason)` for a finished group under `--dynamic-sampling-filter-path` (keep all when unset)."""
    path = args.dynamic_sampling_filter_path
    if path is None:
        return True, None
    fn = load_function(path, "--dynamic-sampling-filter-path")
    output = call_hook(fn, args, rollout_entries(group))
    if inspect.isawaitable(output):
        close = getattr(output, "close", None)
        if close:
            close()
        raise ConfigError(f"--dynamic-sampling-filter-path {path!r} is async; a filter must be a plain function")
    if isinstance(output, bool):
        return output, None
    if hasattr(output, "keep"):
        return bool(output.keep), getattr(output, "reason", None)
    if isinstance(output, tuple) and len(output) == 2:
        return bool(output[0]), output[1]
    raise ConfigError(
        f"--dynamic-sampling-filter-path {path!r} returned {type(output).__name__}; return an object with "
        "`keep` and `reason` (DynamicFilterOutput) or a bool"
    )
