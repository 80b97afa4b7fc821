"""Flags forwarded to the servers vime starts: every `vllm serve` flag as `--vllm-<flag>` and
every vllm-router flag as `--router-<flag>`, generated from the servers' own parsers so their
types and choices are checked at parse time, and passed on as the user typed them.

`vime.config.args` adds them to vime's parser only when argv uses the prefix (building vLLM's parser
imports vLLM: seconds).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import importlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from vime.errors import ConfigError
from vime.config.vllm_options import OptionTable, ServerOption, installed_source, raw_checker

_FALLBACK_ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two", "consistent_hash")

_NO_VALUE = object()

# Where `vllm serve`'s parser lives; the first importable one wins (tests point this elsewhere).
VLLM_PARSER_SOURCES = (
    ("vllm.entrypoints.launchers.cli_args", "make_arg_parser"),  # vLLM >= 0.2x: `vllm serve` flags
    ("vllm.entrypoints.openai.cli_args", "make_arg_parser"),  # older layout
)
ROUTER_PARSER_SOURCE = ("vllm_router.router_args", "RouterArgs")
# vLLM flags vime sets per server itself; a user value would break the fleet.
RESERVED_VLLM = {
    "--model": "vime passes --hf-checkpoint as the model; set --hf-checkpoint",
    "--host": "vime assigns each server its address; clients use --vllm-router-ip",
    "--port": "vime assigns each server its port; clients use --vllm-router-port",
}


@functools.cache
def vllm_actions() -> tuple[tuple[argparse.Action, ...], float]:
    """vLLM's `serve` parser actions and the seconds it took to build them (imports vLLM)."""
    start = time.perf_counter()
    errors = []
    for module_name, attr in VLLM_PARSER_SOURCES:
        try:
            with _quiet_import():
                make = getattr(importlib.import_module(module_name), attr)
            from vllm.utils.argparse_utils import FlexibleArgumentParser
        except Exception as exc:  # noqa: BLE001 - a broken vLLM install fails here too; report it
            errors.append(f"{module_name}: {exc}")
            continue
        return tuple(make(FlexibleArgumentParser())._actions), time.perf_counter() - start
    raise ImportError("; ".join(errors))


@contextlib.contextmanager
def _quiet_import():
    """Importing vLLM logs its platform probing (Triton, CPU backend) at info and warning level:
    on the console of a flag check, before the one line that matters. Errors still show."""
    logging.disable(logging.WARNING)
    try:
        yield
    finally:
        logging.disable(logging.NOTSET)


@functools.cache
def router_actions() -> tuple[argparse.Action, ...]:
    router_args = getattr(importlib.import_module(ROUTER_PARSER_SOURCE[0]), ROUTER_PARSER_SOURCE[1])
    parser = argparse.ArgumentParser(add_help=False)
    router_args.add_cli_args(parser, exclude_host_port=True)  # vime owns where the router listens
    return tuple(parser._actions)


def vllm_option_table() -> OptionTable:
    """The installed vLLM's `serve` options, from the record of an earlier build when there is one
    (vime.config.vllm_options); raises ImportError, saying why, when vLLM cannot be imported."""
    return _table_for(VLLM_PARSER_SOURCES)


@functools.cache
def _table_for(sources: tuple[tuple[str, str], ...]) -> OptionTable:
    source = installed_source(sources)
    if source is None:  # not installed (this raises the ImportError that says so), or without metadata
        vllm_actions()
        return OptionTable(None, lambda: vllm_actions()[0])  # no version to key a record by: memory only
    return OptionTable.for_source(source, lambda: vllm_actions()[0])


def router_options() -> tuple[tuple[ServerOption, ...], Callable[[ServerOption], Callable[[str], str]]]:
    """vllm-router's options and their checker (its parser is cheap to build: not recorded)."""
    actions = {a.option_strings[0]: a for a in router_actions() if a.option_strings}
    options = tuple(ServerOption.of(a) for a in actions.values())
    return options, lambda o: raw_checker(actions[o.option_strings[0]].type, actions[o.option_strings[0]].choices)


def vllm_parser_build_seconds() -> float:
    """Seconds this process spent importing vLLM and building its parser (builds it if needed)."""
    return vllm_actions()[1]


@functools.cache
def router_policies() -> tuple[str, ...]:
    try:
        action = next(a for a in router_actions() if "--policy" in a.option_strings)
        return tuple(action.choices)
    except (ImportError, StopIteration):
        return _FALLBACK_ROUTER_POLICIES


class _Forward(argparse.Action):
    """One generated flag: appends its server-side tokens to `namespace.<dest>` (a list).

    Each alias (`--vllm-gpu-memory-utilization`, `--vllm-no-enforce-eager`, ...) is an action
    of its own, so an error names exactly the option the user typed.
    """

    def __init__(self, option_strings, dest, *, server_flag, reserved=None, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.server_flag = server_flag
        self.reserved = reserved

    def __call__(self, parser, namespace, values, option_string=None):
        if self.reserved:
            parser.error(f"{option_string} is not forwarded: {self.reserved}")
        tokens = list(getattr(namespace, self.dest, None) or [])
        if self.nargs == 0 or values is _NO_VALUE:
            tokens.append(self.server_flag)
        elif isinstance(values, list):
            tokens += [self.server_flag, *values]
        elif values.startswith("-"):
            tokens.append(f"{self.server_flag}={values}")
        else:
            tokens += [self.server_flag, values]
        setattr(namespace, self.dest, tokens)


def add_forwarded(group, options: Sequence[ServerOption], checker, prefix: str, dest: str, taken: set[str],
                  reserved: dict[str, str]) -> None:
    """Add `--<prefix><flag>` for every long option of the server's `options`, with the same nargs
    and choices, values checked by `checker(option)`; options already in `taken` (vime's own flags)
    keep their vime meaning."""
    for action in options:
        if action.help_action:
            continue
        why = next((reserved[o] for o in action.option_strings if o in reserved), None)
        kwargs: dict[str, Any] = {"nargs": action.nargs, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS}
        if action.nargs != 0:
            kwargs["type"] = checker(action)
            kwargs["metavar"] = action.metavar or action.dest.upper()
            if action.nargs == "?":
                kwargs["const"] = _NO_VALUE
        for opt in action.option_strings:
            # A router flag already named router-* keeps its name (--router-temperature, not doubled).
            ours = opt if prefix == "router-" and opt.startswith("--router-") else f"--{prefix}{opt[2:]}"
            if not opt.startswith("--") or ours in taken:
                continue
            taken.add(ours)
            group.add_argument(ours, action=_Forward, dest=dest, server_flag=opt, reserved=why, **kwargs)


def pull_dotted_vllm(argv: list[str], parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """Take vLLM's dotted JSON form (`--vllm-compilation-config.mode 3`) out of argv.

    argparse does not know these options; vLLM's parser assembles them into one JSON value.
    """
    rest, forwarded = [], []
    i = 0
    while i < len(argv):
        tok = argv[i]
        key = tok.split("=", 1)[0]
        base = key.split(".", 1)[0]
        action = parser._option_string_actions.get(base) if "." in key and tok.startswith("--vllm-") else None
        if isinstance(action, _Forward) and action.nargs != 0:
            server = action.server_flag + key[len(base):]
            if "=" in tok:
                forwarded.append(f"{server}={tok.split('=', 1)[1]}")
            elif i + 1 < len(argv):
                forwarded += [server, argv[i + 1]]
                i += 1
            else:
                raise ConfigError(f"{key}: expected one argument")
            i += 1
            continue
        rest.append(tok)
        i += 1
    return rest, forwarded


CHECKED_ENV = "VIME_VLLM_FLAGS_CHECKED"
"""Set to 1 by `vime train` for the workers it starts. Their argv is the launcher's, whose
`--vllm-*` flags vLLM's own parser already checked, so a worker takes them as they are instead
of importing vLLM to build that parser: ~10 s of CPU per worker on 2 cores, spent while the vLLM
server starts on the same cores."""


def take_checked_vllm_flags(argv: list[str], own: set[str]) -> tuple[list[str], list[str]]:
    """Split an argv whose `--vllm-*` flags were checked into the other tokens and the server's
    tokens (`--vllm-X v` -> `--X v`, with every value up to the next flag; vime takes no
    positional arguments, so a token not starting with `--` belongs to the flag before it)."""
    rest: list[str] = []
    server: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name = tok.split("=", 1)[0]
        if not name.startswith("--vllm-") or name.split(".", 1)[0] in own:
            rest.append(tok)
            i += 1
            continue
        end = i + 1
        while end < len(argv) and not argv[end].startswith("--"):
            end += 1
        flag, eq, value = tok[len("--vllm-"):].partition("=")
        if eq and not value.startswith("-"):  # `--vllm-X=v` -> `--X v`, as the checked parse forwards it
            server += ["--" + flag, value]
        else:
            server.append("--" + tok[len("--vllm-"):])
        server += argv[i + 1:end]
        i = end
    return rest, server
