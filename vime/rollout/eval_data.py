"""Eval sets: `--eval-prompt-data NAME PATH [NAME PATH ...]` read with the eval keys, and the fresh
sample groups of an eval round, addressed by (round, set, prompt index) as training groups are
by position.

An eval prompt's group holds `--n-samples-per-eval-prompt` samples with `group_index = i` (the
prompt's index in its set) and `index = i * n + k`, so seeds (`--rollout-seed + index`) are the
same in every round: rounds differ by the policy, not by the draws. Rollout ids carry the round
and the set (`eval_rollout_id`), apart from the training run's ids (plain sample indices), so a
retried eval group finds its rollouts stored and a round never samples a prompt twice.

Records are read with `--eval-input-key`/`--eval-label-key`/`--eval-tool-key`, each defaulting to
its training key, as slime does.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from vime.errors import ConfigError
from vime.rollout.dataset import PromptDataset
from vime.types import Sample

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_DATASETS: dict[tuple, PromptDataset] = {}


def eval_sets(args: Any) -> list[tuple[str, str]]:
    """`--eval-prompt-data name path [name path ...]` as `(name, path)` pairs. A name is what the
    metrics are keyed by (`eval/<name>/reward_mean`), so it is a plain word, unique."""
    values = list(args.eval_prompt_data or [])
    if len(values) % 2:
        raise ConfigError(f"--eval-prompt-data takes name path pairs, got {len(values)} values: {values}")
    pairs = list(zip(values[0::2], values[1::2], strict=True))
    seen: set[str] = set()
    for name, _ in pairs:
        if not _NAME.match(name):
            raise ConfigError(f"--eval-prompt-data: set name {name!r} must be letters, digits, '_', '.' or '-' "
                              "(it names the metrics eval/<name>/...); give the name first, then the path")
        if name in seen:
            raise ConfigError(f"--eval-prompt-data: set name {name!r} is given twice; each set needs its own name")
        seen.add(name)
    return pairs


def eval_keys(args: Any) -> dict[str, Any]:
    """The record keys of the eval sets: the `--eval-*-key` flags, else the training keys."""
    return {"input_key": args.eval_input_key or args.input_key,
            "label_key": args.eval_label_key or args.label_key,
            "metadata_key": args.metadata_key,
            "tool_key": args.eval_tool_key or args.tool_key}


def eval_dataset(args: Any, name: str) -> PromptDataset:
    """The eval set `name`, read once per process (and per settings that shape its samples)."""
    paths = dict(eval_sets(args))
    if name not in paths:
        raise ConfigError(f"no eval set {name!r}: --eval-prompt-data names {sorted(paths) or 'none'}")
    keys = eval_keys(args)
    cache_key = (paths[name], args.hf_checkpoint, *keys.values(), args.apply_chat_template,
                 repr(args.apply_chat_template_kwargs), args.rollout_max_prompt_len)
    if cache_key not in _DATASETS:
        _DATASETS[cache_key] = PromptDataset.from_args(args, paths[name], flag="--eval-prompt-data", keys=keys)
    return _DATASETS[cache_key]


def eval_rollout_id(step: int, name: str, index: int) -> str:
    """The store's rollout id of eval sample `index` of set `name` in the round at `step`."""
    return f"eval{step}-{name}-{index}"


def eval_prompt_group(args: Any, name: str, position: int) -> list[Sample]:
    """The `--n-samples-per-eval-prompt` fresh samples of prompt `position` of eval set `name`."""
    dataset = eval_dataset(args, name)
    if not 0 <= position < len(dataset):
        raise ConfigError(f"eval set {name!r} has {len(dataset)} prompts, no prompt {position}")
    n = args.n_samples_per_eval_prompt
    group = []
    for k in range(n):
        sample = copy.deepcopy(dataset[position])
        sample.group_index, sample.index = position, position * n + k
        sample.status = Sample.Status.PENDING
        sample.metadata["eval_set"] = name
        group.append(sample)
    return group
