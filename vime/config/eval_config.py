"""`--eval-config FILE`: eval sets with settings of their own, slime's eval config.

The file (YAML, or JSON) is slime's shape: an `eval` mapping (or the top level itself) with
`datasets`, a list of mappings each with a `name` (or a mapping of name to settings), and
`defaults` that every dataset takes unless it sets the key itself:

    eval:
      defaults: {max_response_len: 1024, top_p: 0.7}
      datasets:
        - {name: aime, path: /data/aime.jsonl, rm_type: math, n_samples_per_eval_prompt: 16}
        - {name: gpqa, path: /data/gpqa.jsonl, custom_rm_path: my_rewards.gpqa, n_samples_per_eval_prompt: 2}

The keys are slime's names; a setting a dataset leaves unset falls back to the eval flags and
then the rollout's (`vime.rollout.eval_data.SET_FLAGS` says which flag each key stands for). A
reward is one choice per level: a dataset's `rm_type` or `custom_rm_path` replaces the
defaults' and the run's reward for that set, as a function named for a set must be the one
that scores it.

As in slime, the file replaces `--eval-prompt-data`: its sets are the run's eval sets
(`args.eval_prompt_data` becomes their name path pairs, which a hook reading it sees too).

Read and checked at parse time (`read_eval_config`), every problem one line naming the file and
the key path, all of them at once: a user fixes the file in one go. What needs imports or reads
the data files (the hooks, the reward types, each set's records with its own keys) is checked by
`vime.config.preflight` before any service starts.

The content travels with the run: `parse_args` appends it to the run's recorded flags as
`--eval-config-data` (JSON, with the file's path as `source`), so the workers of a run, a run
restarted by Temporal and `vime eval RUN` read what the launch read, never the file again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from vime.errors import ConfigError

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
"""A set's name keys its metrics (`eval/<name>/pass@1`): a plain word."""

REWARD_KEYS = ("rm_type", "custom_rm_path", "group_rm")
"""A reward is chosen as a whole: a level that names one takes none of these from the level below."""


def _text(v: Any) -> str | None:
    return None if isinstance(v, str) and v.strip() else "must be a non-empty string"


def _dotted(v: Any) -> str | None:
    if not isinstance(v, str) or not v.strip():
        return "must be a dotted path to a function (pkg.module.fn)"
    module, sep, attr = v.rpartition(":") if ":" in v else v.rpartition(".")
    return None if sep and module and attr else f"{v!r} is not a dotted path to a function (pkg.module.fn)"


def _positive_int(v: Any) -> str | None:
    return None if isinstance(v, int) and not isinstance(v, bool) and v > 0 else "must be a positive integer"


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _temperature(v: Any) -> str | None:
    return None if _number(v) and v >= 0 else "must be a number >= 0 (0: greedy)"


def _top_p(v: Any) -> str | None:
    return None if _number(v) and 0 < v <= 1 else "must be a number in (0, 1]"


def _top_k(v: Any) -> str | None:
    ok = isinstance(v, int) and not isinstance(v, bool) and (v == -1 or v >= 1)
    return None if ok else "must be an integer, -1 (off) or >= 1"


def _bool(v: Any) -> str | None:
    return None if isinstance(v, bool) else "must be true or false"


def _mapping(v: Any) -> str | None:
    return None if isinstance(v, dict) and all(isinstance(k, str) for k in v) else "must be a mapping"


def _strings(v: Any) -> str | None:
    ok = isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)
    return None if ok else "must be a list of non-empty strings"


def _token_ids(v: Any) -> str | None:
    ok = isinstance(v, list) and v and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v)
    return None if ok else "must be a list of token ids (integers >= 0)"


SETTINGS: dict[str, Callable[[Any], str | None]] = {
    "input_key": _text, "label_key": _text, "metadata_key": _text, "tool_key": _text,
    "apply_chat_template": _bool, "apply_chat_template_kwargs": _mapping,
    "n_samples_per_eval_prompt": _positive_int,
    "temperature": _temperature, "top_p": _top_p, "top_k": _top_k, "max_response_len": _positive_int,
    "stop": _strings, "stop_token_ids": _token_ids, "skip_special_tokens": _bool,
    "rm_type": _text, "custom_rm_path": _dotted, "group_rm": _bool,
    "custom_generate_function_path": _dotted,
    "metadata_overrides": _mapping,
}
"""What a dataset (or `defaults`) may set, and the check of each value: slime's key names."""

DATASET_KEYS = ("name", "path", *SETTINGS)
NOT_YET = {"rollout_env": "a set evaluated through its own --rollout-env is not supported yet; every set goes "
                         "through the run's environment (issue 23)"}
SLIME_ONLY = ("min_new_tokens", "repetition_penalty", "no_stop_trim", "multimodal_keys", "app_service",
              "eval_task_timeout", "min_eval_samples", "eval_early_stop_remaining", "eval_early_stop_idle_timeout",
              "message_processor", "reward_model", "remote_environment")
"""slime's dataset keys vime does not take (yet): refused with that reason, not as a typo."""


class _Problems:
    """The file's problems, one line each: `eval.yaml: datasets[1].top_p: must be ...`."""

    def __init__(self, source: str) -> None:
        self.source, self.lines = source, []

    def add(self, where: str, what: str) -> None:
        self.lines.append(f"{self.source}: {where}: {what}" if where else f"{self.source}: {what}")

    def unknown(self, where: str, keys: list[str], allowed: tuple[str, ...]) -> None:
        for key in keys:
            at = f"{where}.{key}" if where else key
            if key in NOT_YET:
                self.add(at, NOT_YET[key])
            elif key in SLIME_ONLY:
                self.add(at, f"a key of slime's eval config that vime does not take yet; allowed: {', '.join(allowed)}")
            else:
                self.add(at, f"unknown key; allowed: {', '.join(allowed)}")


def load_file(path: str) -> Any:
    """The parsed file: JSON for `.json`, YAML otherwise (YAML reads JSON too)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--eval-config {path!r}: cannot read it ({exc.strerror}); point it at a YAML or "
                          "JSON eval config (see docs/evaluation.md)") from exc
    try:
        return json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--eval-config {path!r}: not valid JSON (line {exc.lineno}, column {exc.colno}: "
                          f"{exc.msg})") from exc
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise ConfigError(f"--eval-config {path!r}: not valid YAML ({where}{getattr(exc, 'problem', None) or exc})") \
            from exc


def read_eval_config(path: str) -> dict[str, Any]:
    """The eval config at `path`, checked, as `{"source": path, "datasets": [...]}`: each dataset
    a mapping of its name, path and the settings it has, `defaults` laid under it. Raises one
    `ConfigError` whose lines are every problem of the file."""
    return check_eval_config(load_file(path), path)


def check_eval_config(data: Any, source: str) -> dict[str, Any]:
    """`read_eval_config` on the parsed content `data` of the file `source`."""
    problems = _Problems(source)
    eval_cfg, prefix = _eval_mapping(data, problems)
    datasets: list[tuple[str, dict[str, Any]]] = []
    if eval_cfg is not None:
        problems.unknown(prefix.rstrip("."), sorted(set(eval_cfg) - {"defaults", "datasets"}), ("defaults", "datasets"))
        defaults = _defaults(eval_cfg.get("defaults"), prefix + "defaults", problems)
        datasets = _datasets(eval_cfg.get("datasets"), prefix + "datasets", defaults, problems)
    if problems.lines:
        raise ConfigError("\n".join(problems.lines))
    return {"source": source, "datasets": [d for _, d in datasets], "key_paths": [at for at, _ in datasets]}


def key_path(data: dict[str, Any], index: int) -> str:
    """`eval.yaml: eval.datasets[1]`: where dataset `index` of a read config is in its file."""
    paths = data.get("key_paths") or []
    return f"{data['source']}: {paths[index] if index < len(paths) else f'datasets[{index}]'}"


def _eval_mapping(data: Any, problems: _Problems) -> tuple[dict | None, str]:
    if data is None:
        problems.add("", "the file is empty; it lists eval sets under `datasets` (see docs/evaluation.md)")
        return None, ""
    if not isinstance(data, dict):
        problems.add("", f"expected a mapping at the top (`eval:` or `datasets:`), got {type(data).__name__}")
        return None, ""
    if "eval" not in data:
        return data, ""
    problems.unknown("", sorted(set(data) - {"eval"}), ("eval",))
    if not isinstance(data["eval"], dict):
        problems.add("eval", "must be a mapping with `datasets` (and optionally `defaults`)")
        return None, ""
    return data["eval"], "eval."


def _settings(entry: dict, where: str, problems: _Problems) -> None:
    for key in SETTINGS:
        if key in entry and entry[key] is not None and (what := SETTINGS[key](entry[key])):
            problems.add(f"{where}.{key}", f"{what}, got {entry[key]!r}")
    if _names_reward(entry) == 2:
        problems.add(where, "give one reward: rm_type (a built-in) or custom_rm_path (a function), not both")


def _names_reward(entry: dict) -> int:
    return sum(entry.get(k) is not None for k in ("rm_type", "custom_rm_path"))


def _check_group_rm(settings: dict, where: str, problems: _Problems) -> None:
    if settings.get("group_rm") and settings.get("custom_rm_path") is None:
        problems.add(f"{where}.group_rm", ("batches the set's own custom_rm_path, which is not set "
                                               "for it (the run's reward keeps --group-rm as given)"))


def _defaults(raw: Any, where: str, problems: _Problems) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        problems.add(where, f"must be a mapping of dataset settings, got {type(raw).__name__}")
        return {}
    problems.unknown(where, sorted(set(raw) - set(SETTINGS)), tuple(SETTINGS))
    _settings(raw, where, problems)
    _check_group_rm(raw, where, problems)
    return {k: v for k, v in raw.items() if k in SETTINGS and v is not None}


def _entries(raw: Any, where: str, problems: _Problems) -> list[tuple[str, Any]]:
    """`(key path, entry)` per dataset: a list of mappings, or a mapping of name to settings."""
    if isinstance(raw, list):
        return [(f"{where}[{i}]", entry) for i, entry in enumerate(raw)]
    if isinstance(raw, dict):
        out = []
        for name, entry in raw.items():
            entry = {} if entry is None else entry
            if isinstance(entry, dict) and "name" in entry and entry["name"] != name:
                problems.add(f"{where}.{name}.name", f"is {entry['name']!r}, but the entry is keyed {name!r}; "
                                                     "drop one of the two")
            out.append((f"{where}.{name}", {"name": name, **entry} if isinstance(entry, dict) else entry))
        return out
    if raw is None:
        problems.add(where, "is missing: list the eval sets, each with a name and a path")
    else:
        problems.add(where, f"must be a list of datasets (or a mapping of name to settings), got {type(raw).__name__}")
    return []


def _datasets(raw: Any, where: str, defaults: dict[str, Any], problems: _Problems,
              ) -> list[tuple[str, dict[str, Any]]]:
    entries = _entries(raw, where, problems)
    if isinstance(raw, (list, dict)) and not entries:
        problems.add(where, "is empty: list at least one eval set")
    out, seen = [], {}
    for at, entry in entries:
        if not isinstance(entry, dict):
            problems.add(at, f"must be a mapping with a name and a path, got {type(entry).__name__}")
            continue
        problems.unknown(at, sorted(set(entry) - set(DATASET_KEYS)), DATASET_KEYS)
        name = entry.get("name")
        if name is None:
            problems.add(f"{at}.name", "is missing (it keys the metrics, eval/<name>/...)")
        elif not isinstance(name, str) or not NAME.match(name):
            problems.add(f"{at}.name", f"{name!r} must be letters, digits, '_', '.' or '-' (it keys the metrics, "
                                       "eval/<name>/...)")
        elif name in seen:
            problems.add(f"{at}.name", f"{name!r} is also {seen[name]}'s name; each set needs its own")
        else:
            seen[name] = at
        if (what := _text(entry.get("path"))) is not None:
            problems.add(f"{at}.path", "is missing: the set's .jsonl or .parquet file" if entry.get("path") is None
                         else f"{what}, got {entry['path']!r}")
        _settings(entry, at, problems)
        own = {k: v for k, v in entry.items() if k in DATASET_KEYS and v is not None}
        inherited = {k: v for k, v in defaults.items() if not (k in REWARD_KEYS and _names_reward(own))}
        merged = {**inherited, **own}
        _check_group_rm(merged, at, problems)
        out.append((at, merged))
    return out


def eval_config_sets(data: dict[str, Any]) -> list[str]:
    """The config's sets as `--eval-prompt-data` pairs (name, path, name, path, ...)."""
    return [value for d in data["datasets"] for value in (d["name"], d["path"])]


def replaced_sets_note(args: Any) -> str | None:
    """The launch's line when the command gives both `--eval-config` and `--eval-prompt-data`:
    slime's precedence (the file's sets), said rather than silent."""
    if not (args.eval_config and "--eval-prompt-data" in args.argv):
        return None
    return (f"--eval-config {args.eval_config} replaces --eval-prompt-data, as in slime: the eval sets are "
            f"{', '.join(args.eval_prompt_data[0::2])}")
