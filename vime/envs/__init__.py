"""Rollout environments: find one by `--rollout-env`, and the pieces it names.

`--rollout-env` takes a built-in's name (`groups`, the default: single-turn prompt groups;
`coding_agent`; the examples') or a module's dotted path; the module
holds `ENVIRONMENT` (`vime.envs.base.Environment`). The flag parser loads it first, to add its
flags; the rollout worker loads it again to register its workflows and activities; the training
workflow only ever sees `Environment.group_workflow`, a registered workflow name.
"""

from __future__ import annotations

import inspect
from typing import Any

from vime.envs.base import EnvContext, Environment, EnvWorkers, GroupInput, GroupOutput, env_flag
from vime.errors import ConfigError
from vime.plugins import _import, load_function

__all__ = ["BUILTIN", "EnvContext", "Environment", "EnvWorkers", "GroupInput", "GroupOutput", "env_flag",
           "load_environment", "resolve", "workflow_classes"]

BUILTIN = {
    "groups": "vime.envs.groups",
    "coding_agent": "vime.envs.coding_agent",
    "tool_use": "examples.tool_use.env",
    "multi_agent": "examples.multi_agent.env",
}
# `--rollout-workflow`, the flag before environments, named the workflow: its values still work.
LEGACY_WORKFLOWS = {"RolloutWorkflow": "groups", "CodingAgentRolloutWorkflow": "coding_agent"}
FLAG = "--rollout-env"


def load_environment(spec: str, flag: str = FLAG) -> Environment:
    """The environment `spec` names: a built-in's name or a module's dotted path (its
    `ENVIRONMENT`). Any failure is one `ConfigError` naming the flag, the value and the fix."""
    spec = (spec or "").strip()
    module_name = BUILTIN.get(spec, spec)
    if not module_name or not all(p.isidentifier() for p in module_name.split(".")):
        raise ConfigError(f"{flag} {spec!r}: expected a built-in ({', '.join(BUILTIN)}) or a module's dotted path")
    try:
        module = _import(module_name, flag, spec)
    except ConfigError as exc:
        if spec in BUILTIN or "." in spec:
            raise
        raise ConfigError(f"{flag} {spec!r}: no such environment; built-ins: {', '.join(BUILTIN)}, "
                          "or a module's dotted path (pkg.my_env) whose ENVIRONMENT declares it") from exc
    env = getattr(module, "ENVIRONMENT", None)
    if not isinstance(env, Environment):
        raise ConfigError(f"{flag} {spec!r}: module {module_name!r} has no ENVIRONMENT "
                          f"(a vime.envs.Environment); got {type(env).__name__}")
    return env


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
