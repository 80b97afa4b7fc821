"""A metrics line's keys as the tags TensorBoard and W&B show: grouped `train/`, `rollout/`,
`eval/`, `perf/`, `sync/` (slime's groups, plus `sync/` for the weight syncs), bookkeeping left out.

`metrics.jsonl` keeps the flat keys the trainer and the workflow report (`vime report`, `vime
status` read them); only the dashboards get the grouped names, so a user finds the loss under
`train/`, the reward under `rollout/` and a slow phase under `perf/` without reading 40 flat tags.
"""

from __future__ import annotations

import math
from typing import Any

GROUPS = ("train", "rollout", "eval", "perf", "sync")

BOOKKEEPING = frozenset({"step", "finished_at", "eval_only", "eval_checkpoint", "run_id", "rollout_id"})
"""Keys of a line that are not figures: the step is the x axis, the others say when or which."""

ROLLOUT_KEYS = frozenset({
    "reward_mean", "response_length_mean", "rollouts", "samples", "failed_samples", "staleness_mean",
    "staleness_max", "dropped_groups", "rollouts_in_flight", "groups_cancelled",
})
"""What the step's sampling produced (the rest of the trainer's report goes to `train/`)."""


def tag(key: str) -> str | None:
    """The grouped tag of `key`, or None for bookkeeping. Keys already grouped keep their name
    (`eval/<set>/reward_mean`); `eval_*` and `sync_*` move under their group; `weight_version`
    (how many syncs) is a sync figure; seconds and rates are `perf/`."""
    if key in BOOKKEEPING:
        return None
    if key.split("/", 1)[0] in GROUPS and "/" in key:
        return key
    for group in ("eval", "sync"):
        if key.startswith(group + "_"):
            return f"{group}/{key[len(group) + 1:]}"
    if key == "weight_version":
        return "sync/weight_version"
    if key.endswith(("_seconds", "_per_second")):
        return f"perf/{key}"
    return f"{'rollout' if key in ROLLOUT_KEYS else 'train'}/{key}"


def figures(metrics: dict[str, Any]) -> dict[str, float]:
    """The line's finite numbers under their tags (booleans, strings and NaN are no scalars)."""
    out = {}
    for key, value in metrics.items():
        name = tag(key)
        if (name is not None and isinstance(value, int | float) and not isinstance(value, bool)
                and math.isfinite(value)):
            out[name] = float(value)
    return out
