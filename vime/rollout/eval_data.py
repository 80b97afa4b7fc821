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

With `--eval-config` (`vime.config.eval_config`) each set has settings of its own: `eval_set_args`
is the run's args with the set's settings laid over the flags they stand for (`SET_FLAGS`), so
the dataset, the sampling, the generate function and the reward of the set's groups all read
them the way they read the flags, and a hook called for the set sees them in its `args`.
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
_VIEWS: dict[tuple[int, str], tuple[Any, Any]] = {}

SET_FLAGS = {
    "input_key": "eval_input_key", "label_key": "eval_label_key", "tool_key": "eval_tool_key",
    "metadata_key": "metadata_key", "apply_chat_template": "apply_chat_template",
    "apply_chat_template_kwargs": "apply_chat_template_kwargs",
    "n_samples_per_eval_prompt": "n_samples_per_eval_prompt",
    "temperature": "eval_temperature", "top_p": "eval_top_p", "top_k": "eval_top_k",
    "max_response_len": "eval_max_response_len",
    "stop": "rollout_stop", "stop_token_ids": "rollout_stop_token_ids",
    "skip_special_tokens": "rollout_skip_special_tokens",
    "rm_type": "rm_type", "custom_rm_path": "custom_rm_path", "group_rm": "group_rm",
    "custom_generate_function_path": "custom_generate_function_path",
}
"""An `--eval-config` dataset key (slime's name) -> the flag (`VimeArgs` field) it stands for."""


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


def eval_set_config(args: Any, name: str) -> dict[str, Any]:
    """The `--eval-config` settings of set `name` ({} for a `--eval-prompt-data` set)."""
    data = args.eval_config_data
    if not data:
        return {}
    for entry in data["datasets"]:
        if entry["name"] == name:
            return entry
    raise ConfigError(f"no eval set {name!r}: --eval-config {args.eval_config} names "
                      f"{', '.join(d['name'] for d in data['datasets'])}")


def eval_set_args(args: Any, name: str) -> Any:
    """The run's `args` as eval set `name` is evaluated with them: its `--eval-config` settings
    laid over the flags they stand for (`SET_FLAGS`). A set that names its reward (`rm_type` or
    `custom_rm_path`) is scored by that one only: the run's other reward flags are cleared."""
    entry = eval_set_config(args, name)
    changes = {SET_FLAGS[k]: v for k, v in entry.items() if k in SET_FLAGS}
    if not changes:
        return args
    kept = _VIEWS.get((id(args), name))
    if kept is not None and kept[0] is args:
        return kept[1]
    if "rm_type" in entry or "custom_rm_path" in entry:
        changes = {"rm_type": None, "custom_rm_path": None, "group_rm": False, **changes}
    view = args.replace(**changes)
    if len(_VIEWS) > 256:
        _VIEWS.clear()
    _VIEWS[(id(args), name)] = (args, view)
    return view


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
    args = eval_set_args(args, name)
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
    """The `--n-samples-per-eval-prompt` fresh samples of prompt `position` of eval set `name`
    (the set's own count with `--eval-config`; its `metadata_overrides` and `rm_type` are laid
    over each sample's metadata, as slime does). Generate and score them with
    `eval_set_args(args, name)`."""
    dataset = eval_dataset(args, name)
    if not 0 <= position < len(dataset):
        raise ConfigError(f"eval set {name!r} has {len(dataset)} prompts, no prompt {position}")
    entry = eval_set_config(args, name)
    n = eval_set_args(args, name).n_samples_per_eval_prompt
    overrides = {**entry.get("metadata_overrides", {}), **({"rm_type": entry["rm_type"]} if "rm_type" in entry else {})}
    group = []
    for k in range(n):
        sample = copy.deepcopy(dataset[position])
        sample.group_index, sample.index = position, position * n + k
        sample.status = Sample.Status.PENDING
        sample.metadata.update(overrides)
        sample.metadata["eval_set"] = name
        group.append(sample)
    return group
