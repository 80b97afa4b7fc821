"""Where vime keeps what it builds or learns once per machine: `$VIME_CACHE`, else `~/.cache/vime`
(the tiny test model, the examples' warm starts, the tokenizer class each checkpoint resolves to)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    return Path(os.environ.get("VIME_CACHE") or Path.home() / ".cache" / "vime").expanduser()
