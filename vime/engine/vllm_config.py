"""`--vllm-config`: the YAML that describes server groups, models and per-group overrides.

Read and checked at parse time for what is cheap (the file exists, it is a YAML mapping); the
topology it describes is the engine launcher's to interpret.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from vime.errors import ConfigError


def read_vllm_config(path: str) -> dict:
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"--vllm-config {path!r}: cannot read it ({exc.strerror})") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"--vllm-config {path!r}: not valid YAML ({_yaml_problem(exc)})") from exc
    if data is None:
        raise ConfigError(f"--vllm-config {path!r}: the file is empty; see docs/vllm-config.md for its format")
    if not isinstance(data, dict):
        raise ConfigError(f"--vllm-config {path!r}: expected a YAML mapping at the top, got {type(data).__name__}")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """`line 4, column 9: expected ',' or '}', but got ':'`, or PyYAML's first line."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
