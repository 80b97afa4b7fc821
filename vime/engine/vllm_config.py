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
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"--vllm-config {path!r}: not valid YAML ({first})") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"--vllm-config {path!r}: expected a YAML mapping at the top, got {type(data).__name__}")
    return data
