"""The `vime` flags, parsed once into a typed `VimeArgs`.

Three kinds of flags share one command line:

- vime's own flags, spelled as slime spells them (`--rollout-batch-size`, `--custom-rm-path`, ...),
  declared once below as `VimeArgs` fields: the field is the flag, its type, default and help;
- `--vllm-<flag>`: every `vllm serve` flag, generated from vLLM's own parser so types, choices
  and nargs match the installed vLLM; the ones the user set land in `args.vllm_server_args` as
  server CLI tokens, spelled as the user spelled their values;
- `--router-<flag>`: every vllm-router flag, generated the same way, forwarded in `args.router_args`.

The fields themselves (`VimeArgs`, `flag_fields`) are declared in `vime.config.flags`.

Importing vLLM takes seconds, so the generated `--vllm-*` flags are only built when the command
line uses one, and at most once per process.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import importlib
import importlib.util
import json
import os
import sys
import typing
from typing import Any, NoReturn

from vime.config import forward
from vime.config.resolve import resolve, trains_on_rollouts
from vime.config.precision import resolve_precision
from vime.envs import BUILTIN, LEGACY_WORKFLOWS, Environment, load_environment
from vime.envs import resolve as resolve_env
from vime.errors import ConfigError
from vime.config.flags import GROUPS, VimeArgs, _option, flag_fields
from vime.plugins import _add_cwd_to_path

class _Parser(argparse.ArgumentParser):
    """An ArgumentParser that raises `ConfigError` instead of exiting (help still exits 0)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message.removeprefix("argument "))


# ---------------------------------------------------------------- the parser


def _add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field, hint: Any) -> None:
    """One dataclass field as a flag: type, bool action and list nargs from its annotation."""
    meta = dict(f.metadata)
    meta.pop("group")
    option = meta.pop("flag", None) or _option(f)
    kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, **meta}
    default = f.default_factory() if f.default is dataclasses.MISSING else f.default
    if default is not None and not isinstance(default, (bool, dict)):
        kwargs["help"] += f" (default: {default})"
    base = [a for a in typing.get_args(hint) if a is not type(None)] if typing.get_origin(hint) else []
    if hint is bool:
        kwargs.setdefault("action", "store_false" if f.default else "store_true")
    elif "type" not in kwargs:
        inner = base[0] if base else hint
        if typing.get_origin(inner) is list:
            kwargs.update(nargs="+", type=typing.get_args(inner)[0])
        else:
            kwargs["type"] = inner
    if f.name == "router_policy":
        kwargs["choices"] = forward.router_policies()
    if "choices" in kwargs and "action" not in kwargs:
        kwargs["metavar"] = "{" + ",".join(kwargs["choices"]) + "}"
    group.add_argument(option, **kwargs)


def env_flag_fields(env: Environment | None) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(env.flags) if "group" in f.metadata] if env and env.flags else []


def build_parser(*, vllm: bool = False, router: bool = False, env: Environment | None = None) -> argparse.ArgumentParser:
    """vime's parser; `vllm=True` / `router=True` add the generated `--vllm-*` / `--router-*` flags,
    `env` the rollout environment's own flags (a group of their own).

    Raises ConfigError when the generated flags are asked for but vLLM / vllm-router is missing.
    """
    parser = _Parser(
        prog="vime",
        usage="%(prog)s [flags]",
        allow_abbrev=False,
        description="Agentic RL: vLLM rollouts, FSDP2 training, Temporal orchestration. Flags use slime's names.",
    )
    groups = {name: parser.add_argument_group(name, desc) for name, desc in GROUPS.items()}
    hints = typing.get_type_hints(VimeArgs)
    for f in flag_fields():
        _add_flag(groups[f.metadata["group"]], f, hints[f.name])
    if env_flag_fields(env):
        group = parser.add_argument_group(f"environment {env.name}", env.description or None)
        env_hints = typing.get_type_hints(env.flags)
        for f in env_flag_fields(env):
            if _option(f) in parser._option_string_actions:
                raise ConfigError(f"--rollout-env {env.name}: its flag {_option(f)} is already one of vime's; "
                                  "rename it in the environment's flags")
            _add_flag(group, f, env_hints[f.name])

    taken = set(parser._option_string_actions)
    if vllm:
        try:
            table = forward.vllm_option_table()
            options = table.options()
        except ImportError as exc:
            raise ConfigError(
                f"--vllm-* server flags need vLLM, which cannot be imported here ({exc}); "
                "install it with `pip install 'vime[cpu]'` (CPU hosts) or `pip install 'vime[gpu]'`"
            ) from exc
        forward.add_forwarded(groups["vLLM"], options, table.checker, "vllm-", "vllm_server_args", taken,
                              forward.RESERVED_VLLM)
    if router:
        try:
            options, checker = forward.router_options()
        except ImportError as exc:
            raise ConfigError(
                f"--router-* flags need vllm-router, which cannot be imported here ({exc}); "
                "install it with `pip install 'vime[cpu]'` or `pip install 'vime[gpu]'`"
            ) from exc
        forward.add_forwarded(groups["router"], options, checker, "router-", "router_args", taken, {})
    return parser


def _own_options() -> set[str]:
    return {_option(f) for f in flag_fields()}


def _uses_prefix(argv: list[str], prefix: str, own: set[str]) -> bool:
    return any(t.startswith(prefix) and t.split("=", 1)[0] not in own for t in argv)


def _builtin_env_with_flag(option: str) -> str | None:
    """The built-in environment that has `option` among its flags (for the unknown-flag line).
    vime's own only: they are vime's modules, light to import. A name another distribution
    registers is never imported to answer this (only the chosen `--rollout-env` is)."""
    for name in BUILTIN:
        try:
            env = load_environment(name)
        except ConfigError:  # an example that is not importable here
            continue
        if option in {_option(f) for f in env_flag_fields(env)}:
            return name
    return None


def _unknown_flag_error(extras: list[str], parser: argparse.ArgumentParser) -> ConfigError:
    flag = next((t for t in extras if t.startswith("-")), None)
    if flag is None:
        return ConfigError(f"unexpected argument {extras[0]!r} (vime takes flags only)")
    name = flag.split("=", 1)[0]
    known = [o for o in parser._option_string_actions if o.startswith("--")]
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    where = "; vLLM has no such flag" if name.startswith("--vllm-") else ""
    where = "; vllm-router has no such flag" if name.startswith("--router-") else where
    owner = _builtin_env_with_flag(name)
    if owner:
        return ConfigError(f"{name} is a flag of the {owner} environment: add --rollout-env {owner}")
    return ConfigError(f"unknown flag {name}{where}{hint}; see `vime --help`")


def _flag_value(argv: list[str], option: str) -> str | None:
    """The last value given to `option` (`--x v` or `--x=v`), before parsing: the environment
    decides which flags the parser has."""
    value = None
    for i, token in enumerate(argv):
        if token == option and i + 1 < len(argv):
            value = argv[i + 1]
        elif token.startswith(option + "="):
            value = token.split("=", 1)[1]
    return value


def flags_environment(argv: list[str]) -> Environment | None:
    """The environment whose flags this command line may use: the one `--rollout-env` (or the
    older `--rollout-workflow`) names, else the one whose package holds the generate hook
    (`--custom-generate-function-path vime.envs.coding_agent.generate.generate` takes the coding
    agent's `--agent-*` flags while the groups stay single-turn)."""
    spec = _flag_value(argv, "--rollout-env")
    if spec is None:
        spec = LEGACY_WORKFLOWS.get(_flag_value(argv, "--rollout-workflow") or "")
    if spec is not None:
        return load_environment(spec)
    hook = _flag_value(argv, "--custom-generate-function-path")
    if not hook:
        return None
    module = hook.partition(":")[0] if ":" in hook else hook.rpartition(".")[0]
    parts = module.split(".")
    if parts[0].isidentifier() and importlib.util.find_spec(parts[0]) is None:
        _add_cwd_to_path()  # as the hook's loader will: `vime` run from a repository root imports its examples
    for end in range(len(parts), 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:end]))
        except Exception:  # noqa: BLE001 - a broken hook is reported by the hook's own check, later
            continue
        if isinstance(getattr(owner, "ENVIRONMENT", None), Environment):
            return owner.ENVIRONMENT
    return None


def _take_environment(args: VimeArgs, env: Environment | None, values: dict[str, Any]) -> None:
    """`--rollout-env` settled (the older `--rollout-workflow` agreeing with it), and the
    environment's own flags into `args.env_args`, checked by the environment."""
    if args.rollout_workflow is not None:
        legacy = LEGACY_WORKFLOWS[args.rollout_workflow]
        if "rollout_env" in values and load_environment(args.rollout_env).name != legacy:
            raise ConfigError(f"--rollout-workflow {args.rollout_workflow} and --rollout-env {args.rollout_env} "
                              f"disagree; keep --rollout-env only")
        args.rollout_env = legacy
    if env is None:
        return
    if env.flags is not None:
        args.env_args = env.flags(**{f.name: values[f.name] for f in env_flag_fields(env) if f.name in values})
    if env.check is not None:
        resolve_env(env.check, "check", env)(args)


def parse_args(argv: list[str] | None = None, *, vllm_flags: bool = True) -> VimeArgs:
    """Parse `argv` (default: sys.argv[1:]) into `VimeArgs`; every problem raises `ConfigError`.

    Values are checked here where it is cheap: types and choices (vLLM's and the router's own
    for the forwarded flags), positive sizes, and the cross-flag defaults slime applies.
    `vllm_flags=False` takes the `--vllm-*` flags as typed instead: vLLM's parser imports vLLM
    (20-40 s on a loaded machine), so `vime train` checks everything else first and then calls
    `check_vllm_flags`.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    own = _own_options()
    wants_help = any(a in ("-h", "--help") for a in argv)  # help lists the generated groups too
    tokens, checked = argv, []
    if (os.environ.get(forward.CHECKED_ENV) == "1" or not vllm_flags) and not wants_help:
        tokens, checked = forward.take_checked_vllm_flags(argv, own)
    env = flags_environment(argv)
    own |= {_option(f) for f in env_flag_fields(env)}
    parser = build_parser(vllm=wants_help or _uses_prefix(tokens, "--vllm-", own),
                          router=wants_help or _uses_prefix(tokens, "--router-", own), env=env)
    tokens, dotted = forward.pull_dotted_vllm(tokens, parser)
    namespace, extras = parser.parse_known_args(tokens)
    if extras:
        raise _unknown_flag_error(extras, parser)
    values = vars(namespace)
    args = VimeArgs(**{f.name: values[f.name] for f in flag_fields() if f.name in values})
    _take_environment(args, env, values)
    args.vllm_server_args = values.get("vllm_server_args", []) + dotted + checked
    args.router_args = values.get("router_args", [])
    if "router_policy" in values:
        args.router_args = ["--policy", args.router_policy, *args.router_args]
    resolve(args)
    resolve_precision(args, given=values.keys(), training=trains_on_rollouts(args))
    args.argv = [*argv, *_recorded_eval_config(argv, args), "--run-id", args.run_id, "--run-dir", args.run_dir]
    return args.read_only()


def _recorded_eval_config(argv: list[str], args: VimeArgs) -> list[str]:
    """`--eval-config-data JSON`, the content of `--eval-config` as read now, for the run's
    recorded flags (`vime.config.eval_config`); nothing when `argv` records that content already."""
    if args.eval_config_data is None:
        return []
    recorded = _flag_value(argv, "--eval-config-data")
    if recorded is not None and json.loads(recorded) == args.eval_config_data:
        return []
    return ["--eval-config-data", json.dumps(args.eval_config_data, separators=(",", ":"))]


def check_vllm_flags(args: VimeArgs) -> VimeArgs:
    """`args` from `parse_args(..., vllm_flags=False)`, parsed again with vLLM's own parser checking
    the `--vllm-*` flags (a bad one raises its `ConfigError`); `args` itself when there are none."""
    if not args.vllm_server_args:
        return args
    checked = parse_args(args.argv)  # the same run id and directory: argv ends with them
    return checked.replace(argv=args.argv)


def parse_args_or_exit(argv: list[str] | None = None) -> VimeArgs:
    """For command-line entry points: a `ConfigError` becomes one line on stderr and exit code 2."""
    try:
        return parse_args(argv)
    except ConfigError as exc:
        print(f"vime: error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
