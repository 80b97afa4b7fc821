"""The environment SDK: `from vime.envs import ...` is the one import an environment author needs.

An environment is a module holding `ENVIRONMENT` (`Environment`: its group workflow, workflows,
activities, flags); `--rollout-env` takes a built-in's name (`groups`, the default: single-turn
prompt groups; `coding_agent`; `tool_use`; `multi_agent`), a name an installed distribution
registers in the `vime.environments` entry-point group, or that module's dotted path. Names are
listed from the table below and the distributions' metadata: no module is imported to list it,
only the one chosen (its flags are needed). The flag parser loads it to add its flags; the
rollout worker loads it again to register its workflows and activities; the training workflow
only ever sees `Environment.group_workflow`, a registered workflow name, which it starts per
prompt group with a `GroupInput` and which returns a `GroupOutput`. docs/environments.md walks
through it.

What this module offers, by where it runs:

- declaring: `Environment`, `EnvContext`, `EnvWorkers`, `env_flag`; the contract `GroupInput`,
  `GroupOutput`, `summarize`, `sample_previews` (what the Web UI shows of stored samples);
- group workflows (`vime.envs.group_workflow`): `fan_out`, `fan_out_children`,
  `fan_out_activities`, `execute_group_activity`, `finish_group`, `finish_rollout` (a
  per-sample workflow's status, reward and memo), `gathered_previews`, `sample_workflow_id`,
  `rollout_retry_policy`;
- activities (`vime.envs.rollouts`, `vime.temporal`): `group_activity` (a whole single-turn
  group with the environment's own reward), `prompt_group`, `prompt_sample`, `prompt_file`,
  `group_args`, `sampling_params`, `check_policy`, `store_group`, `store_rollout`, `stored_group`, `TurnLog`
  (a multi-turn rollout's turns in the store), `sampled_here` (the attempt and worker sampling a
  turn); given the group's input they serve eval rounds too, `run_group`, `heartbeating`,
  `heartbeats_throughout`, `store_call`, `final_config_errors`;
- sandboxes (`vime.sandbox`): `make_sandbox`, `run_program`, `ProgramResult`.

Those past the first line load when first asked for: the flag parser imports this package, and
temporalio's workflow module alone is most of a pre-start check's CPU.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import traceback
from typing import Any

from vime.envs.base import EnvContext, Environment, EnvWorkers, env_flag
from vime.envs.contract import GroupInput, GroupOutput, SampleInput, sample_previews, summarize
from vime.errors import ConfigError
from vime.plugins import _import, load_function

_LAZY = {
    **dict.fromkeys(("fan_out", "fan_out_children", "fan_out_activities", "execute_group_activity", "finish_group",
                     "finish_rollout", "gathered_previews", "sample_workflow_id"), "vime.envs.group_workflow"),
    **dict.fromkeys(("group_activity", "prompt_group", "prompt_sample", "prompt_file", "group_args",
                     "sampling_params", "check_policy", "store_group", "store_rollout", "stored_group", "TurnLog", "sampled_here"),
                    "vime.envs.rollouts"),
    **dict.fromkeys(("rollout_retry_policy", "final_config_errors", "CONFIG_ERROR"), "vime.temporal.retry"),
    **dict.fromkeys(("heartbeating", "heartbeats_throughout"), "vime.temporal.heartbeat"),
    "store_call": "vime.temporal.store_calls",
    "run_group": "vime.rollout.group",
    **dict.fromkeys(("make_sandbox", "run_program", "ProgramResult"), "vime.sandbox"),
}

__all__ = ["BUILTIN", "ENTRY_POINTS", "EnvContext", "Environment", "EnvWorkers", "GroupInput", "GroupOutput",
           "env_flag", "load_environment", "registered", "resolve", "sample_previews", "summarize", "workflow_classes", *_LAZY]

# vime's own, also declared in pyproject.toml's entry points (a test keeps the two equal): this
# table is what a checkout used without installing (PYTHONPATH only) still resolves.
BUILTIN = {
    "groups": "vime.envs.groups",
    "coding_agent": "vime.envs.coding_agent",
    "tool_use": "vime.envs.tool_use",
    "multi_agent": "vime.envs.multi_agent",
}
# `--rollout-workflow`, the flag before environments, named the workflow: its values still work.
LEGACY_WORKFLOWS = {"RolloutWorkflow": "groups", "CodingAgentRolloutWorkflow": "coding_agent"}
FLAG = "--rollout-env"
# The entry-point group a distribution declares its environments in (pyproject.toml):
#   [project.entry-points."vime.environments"]
#   my_env = "my_pkg.my_env"            # the module's ENVIRONMENT; or "my_pkg.envs:OTHER_NAME"
ENTRY_POINTS = "vime.environments"


def __getattr__(name: str) -> Any:
    """The SDK's heavier names (see the module docstring), imported when first asked for."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def registered() -> dict[str, list[tuple[str, str]]]:
    """Every environment name `--rollout-env` takes, with what declares it: `(target, by)`, target
    "module" or "module:attr", by "vime" or the distribution's name. Read from BUILTIN and the
    installed distributions' metadata only: listing a name imports nothing. A name two
    distributions declare differently has two entries (refused when it is chosen)."""
    names = {name: [(module, "vime")] for name, module in BUILTIN.items()}
    for ep in importlib.metadata.entry_points(group=ENTRY_POINTS):
        entries = names.setdefault(ep.name, [])
        by = ep.dist.name if ep.dist is not None else "?"
        if ep.value.removesuffix(":ENVIRONMENT") not in {target for target, _ in entries}:
            entries.append((ep.value.removesuffix(":ENVIRONMENT"), by))
    return names


def load_environment(spec: str, flag: str = FLAG) -> Environment:
    """The environment `spec` names: a built-in's name (always vime's own), a registered name
    (`registered()`) or a module's dotted path (its `ENVIRONMENT`; "module:attr" names another). Any failure is one `ConfigError` naming the flag,
    the value and the fix; a module that exists but fails to import says why (its error, file:line)."""
    spec = (spec or "").strip()
    names = registered() if spec not in BUILTIN else {spec: [(BUILTIN[spec], "vime")]}
    entries = names.get(spec, [])
    if len(entries) > 1:
        raise ConfigError(f"{flag} {spec!r}: declared by several installed distributions ("
                          + ", ".join(f"{by}: {target}" for target, by in entries)
                          + "); name the module's dotted path instead, or uninstall one")
    module_name, _, attr = (entries[0][0] if entries else spec).partition(":")
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise ConfigError(f"{flag} {spec!r}: expected a built-in ({', '.join(BUILTIN)}) or a module's dotted path")
    try:
        module = _import(module_name, flag, spec)
    except ConfigError as exc:
        if exc.__cause__ is None:  # the module's own ConfigError: already one line that says it all
            raise
        if not _not_found(exc.__cause__, module_name):  # it exists: what its own import raised is the news
            raise _import_failed(flag, spec, module_name, exc.__cause__) from exc.__cause__
        if entries or "." in spec:
            raise
        others = [name for name in names if name not in BUILTIN]
        raise ConfigError(f"{flag} {spec!r}: no such environment; built-ins: {', '.join(BUILTIN)}"
                          + (f"; installed: {', '.join(sorted(others))}" if others else "")
                          + ", or a module's dotted path (pkg.my_env) whose ENVIRONMENT declares it") from exc
    except Exception as exc:  # noqa: BLE001 - the module ran and raised: one line, not a traceback at parse time
        raise _import_failed(flag, spec, module_name, exc) from exc
    env = getattr(module, attr or "ENVIRONMENT", None)
    if not isinstance(env, Environment):
        raise ConfigError(f"{flag} {spec!r}: module {module_name!r} has no {attr or 'ENVIRONMENT'} "
                          f"(a vime.envs.Environment); got {type(env).__name__}")
    return env


def _not_found(exc: BaseException | None, module_name: str) -> bool:
    """True when the module itself (or a package above it) is not there, as opposed to being
    there and failing on one of its own imports."""
    missing = getattr(exc, "name", None) or ""
    return isinstance(exc, ModuleNotFoundError) and (module_name == missing or module_name.startswith(missing + "."))


def _import_failed(flag: str, spec: str, module_name: str, exc: BaseException) -> ConfigError:
    """`exc`, raised while `module_name` was imported, as one line: its type, its message and the
    file:line it came from (a module that exists must not read as "no such environment")."""
    what = "it" if spec == module_name else repr(module_name)
    if isinstance(exc, SyntaxError):
        message, where = exc.msg, (f"{_shown_path(exc.filename)}:{exc.lineno}" if exc.filename else None)
    else:
        message = next((line for line in str(exc).splitlines() if line.strip()), "")
        frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
        where = f"{_shown_path(frames[-1].filename)}:{frames[-1].lineno}" if frames else None
    hint = f"; install {exc.name!r} or fix that import" if isinstance(exc, ModuleNotFoundError) and exc.name else ""
    return ConfigError(f"{flag} {spec!r}: importing {what} failed: {type(exc).__name__}: {message}"
                       + (f" ({where})" if where else "") + hint)


def _shown_path(filename: str) -> str:
    """`filename` relative to the working directory when it is below it (shorter to read)."""
    relative = os.path.relpath(filename) if os.path.isabs(filename) else filename
    return filename if relative.startswith("..") else relative


def resolve(obj: Any, what: str, env: Environment) -> Any:
    """A class or function the environment names, importing it when given as "module:attr"."""
    if not isinstance(obj, str):
        return obj
    return load_function(obj, f"{FLAG} {env.name} ({what})")


def workflow_classes(env: Environment) -> list[type]:
    classes = [resolve(w, "workflows", env) for w in env.workflows]
    for cls in classes:
        if not inspect.isclass(cls) or not hasattr(cls, "__temporal_workflow_definition"):
            raise ConfigError(f"{FLAG} {env.name}: {cls!r} in workflows is not a @workflow.defn class")
    names = {cls.__temporal_workflow_definition.name for cls in classes}
    if env.group_workflow not in names | {"RolloutWorkflow"}:
        raise ConfigError(f"{FLAG} {env.name}: group_workflow {env.group_workflow!r} is none of its workflows "
                          f"({', '.join(sorted(names)) or 'none'})")
    return classes
