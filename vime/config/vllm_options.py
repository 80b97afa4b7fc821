"""`vllm serve`'s options, remembered per vLLM version, so a launch with `--vllm-*` flags need not
import vLLM to check them.

Building vLLM's own parser imports vLLM and torch: ~12 s of CPU here, paid by every `vime train`
that forwards a `--vllm-*` flag, while the vLLM server it starts competes for the same cores. The
parser is the same for one installed vLLM, so the first build is written down:

- the option table (names, nargs, choices, metavar: what argparse needs to rebuild the forwarded
  flags) in `$VIME_CACHE/vllm-options/<source>-<version>.json`;
- the verdict of vLLM's own type on each value a launch checked (`--max-model-len 1024`: fine;
  `--max-model-len 1x`: vLLM's error message), beside it. A value not seen before is checked by
  vLLM's parser, built then, and its verdict recorded: every value is still checked by vLLM's
  own code, once per vLLM version.

The key is the distribution's version as its metadata says (read without importing vLLM), so an
upgrade builds the table again. An unreadable or stale file is rebuilt, never trusted.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.cache import cache_root

FORMAT = 1  # bump when the recorded fields change


@dataclass(frozen=True)
class ServerOption:
    """One option of `vllm serve`, as vime forwards it: enough to rebuild the `--vllm-*` flag, and
    whether vLLM converts its value (then vLLM's type, not vime, says whether a value is valid)."""

    option_strings: tuple[str, ...]
    dest: str
    nargs: Any
    choices: tuple | None
    metavar: Any
    typed: bool
    help_action: bool = False

    @classmethod
    def of(cls, action: argparse.Action) -> ServerOption:
        return cls(tuple(action.option_strings), action.dest, action.nargs,
                   tuple(action.choices) if action.choices is not None else None,
                   list(action.metavar) if isinstance(action.metavar, tuple) else action.metavar,
                   callable(action.type), isinstance(action, argparse._HelpAction))

    def to_json(self) -> dict:
        return {"option_strings": list(self.option_strings), "dest": self.dest, "nargs": self.nargs,
                "choices": list(self.choices) if self.choices is not None else None,
                "metavar": self.metavar, "typed": self.typed, "help_action": self.help_action}

    @classmethod
    def from_json(cls, raw: dict) -> ServerOption:
        choices = raw["choices"]
        metavar = raw["metavar"]
        return cls(tuple(raw["option_strings"]), raw["dest"], raw["nargs"], tuple(choices) if choices is not None else None,
                   tuple(metavar) if isinstance(metavar, list) else metavar, raw["typed"], raw["help_action"])


def installed_source(sources: Sequence[tuple[str, str]]) -> tuple[str, str, str] | None:
    """The first parser source whose package is installed, with that package's version, found
    without importing it; None when no source's package is installed."""
    for module_name, attr in sources:
        top = module_name.split(".", 1)[0]
        try:
            if importlib.util.find_spec(top) is None:
                continue
        except (ImportError, ValueError):
            continue
        versions = _versions_providing(top)
        if versions:
            return module_name, attr, "+".join(sorted(versions))
    return None


def _versions_providing(top: str) -> list[str]:
    """`name-version` of the installed distributions that provide package `top`: from their
    `top_level.txt` (5 ms here), else from every distribution's file list
    (`packages_distributions`, 260 ms: paid on every parse otherwise)."""
    found = [f"{d.metadata['Name']}-{d.version}" for d in importlib.metadata.distributions()
             if top in (d.read_text("top_level.txt") or "").split()]
    if found:
        return found
    return [f"{name}-{importlib.metadata.version(name)}"
            for name in importlib.metadata.packages_distributions().get(top) or []]


class OptionTable:
    """The options of one installed vLLM and the verdicts on values checked so far, kept in a
    file; `build` gives vLLM's real parser actions when something is not recorded yet."""

    def __init__(self, path: Path | None, build: Callable[[], tuple[argparse.Action, ...]]) -> None:
        self.path = path
        self._build = build
        self._options: tuple[ServerOption, ...] | None = None
        self._verdicts: dict[str, dict[str, str]] = {}
        self._load()

    @classmethod
    def for_source(cls, source: tuple[str, str, str], build) -> OptionTable:
        module_name, attr, version = source
        name = f"{module_name}.{attr}-{version}-py{sys.version_info[0]}{sys.version_info[1]}"
        return cls(cache_root() / "vllm-options" / f"{name}.json", build)

    def options(self) -> tuple[ServerOption, ...]:
        if self._options is None:
            self._options = tuple(ServerOption.of(a) for a in self._build())
            self._save()
        return self._options

    def checker(self, option: ServerOption) -> Callable[[str], str]:
        """Check a raw value the way vLLM's parser would, and keep the user's string: a value is
        valid when vLLM's type converts it and the result is among the choices."""
        key = option.option_strings[0] if option.option_strings else option.dest

        def check(raw: str) -> str:
            if not option.typed:
                if option.choices is not None and raw not in option.choices:
                    raise argparse.ArgumentTypeError(_bad_choice(raw, option.choices))
                return raw
            verdict = self._verdicts.get(key, {}).get(raw)
            if verdict is None:
                verdict = self._judge(key, raw)
            if verdict:
                raise argparse.ArgumentTypeError(verdict)
            return raw

        return check

    def _judge(self, key: str, raw: str) -> str:
        """vLLM's own verdict on `raw` for option `key` ("" when valid), recorded for next time."""
        action = next(a for a in self._build() if key in a.option_strings or key == a.dest)
        try:
            raw_checker(action.type, action.choices)(raw)
            verdict = ""
        except argparse.ArgumentTypeError as exc:
            verdict = str(exc)
        self._verdicts.setdefault(key, {})[raw] = verdict
        self._save()
        return verdict

    def _load(self) -> None:
        if self.path is None:
            return
        try:
            data = json.loads(self.path.read_text())
            if data.get("format") != FORMAT:
                return
            self._options = tuple(ServerOption.from_json(o) for o in data["options"])
            self._verdicts = {k: dict(v) for k, v in data.get("verdicts", {}).items()}
        except (OSError, ValueError, KeyError, TypeError):
            self._options, self._verdicts = None, {}

    def _save(self) -> None:
        """Write the whole file anew and rename it into place: a reader sees the old file or the
        new one, never half of one (two launches at once may each drop the other's new verdict,
        which only costs a rebuild)."""
        if self._options is None or self.path is None:
            return
        data = {"format": FORMAT, "options": [o.to_json() for o in self._options], "verdicts": self._verdicts}
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=self.path.name, suffix=".tmp")
            with os.fdopen(fd, "w") as f:
                json.dump(data, f)
            os.replace(tmp, self.path)
        except OSError:
            pass  # a read-only cache only costs the next launch a rebuild


def _bad_choice(raw: str, choices: Sequence) -> str:
    shown = ", ".join(str(c) for c in choices if c is not None)
    return f"invalid choice {raw!r} (choose from {shown})"


def _one_line(exc: BaseException) -> str:
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip() and "further information" not in ln]
    return "; ".join(lines) or type(exc).__name__


def raw_checker(convert: Any, choices: Any) -> Callable[[str], str]:
    """Validate a value with the server's own type and choices, but keep the user's string.

    Server types may turn strings into objects (dataclasses, enums) that do not print back
    as CLI values, so the forwarded token is always the raw string.
    """

    def check(raw: str) -> str:
        value = raw
        if callable(convert):
            try:
                value = convert(raw)
            except Exception as exc:  # noqa: BLE001 - any failure of the server's type is a bad value
                raise argparse.ArgumentTypeError(f"invalid value {raw!r}: {_one_line(exc)}") from exc
        if choices is not None and value not in choices:
            raise argparse.ArgumentTypeError(_bad_choice(raw, choices))
        return raw

    return check
