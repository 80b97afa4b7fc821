"""The build id every vime worker reports to Temporal: a hash of vime's own source files.

Without one, the Temporal SDK hashes the bytecode of every module loaded in the process (torch
and transformers included) when the first worker is created: 1.2-1.9 s of CPU per worker process
on these 2-core machines, paid by each of a launch's workers and again at every rerun. The id
only labels which code a workflow task ran on (its history event shows it); vime does not use
worker versioning, so a hash of vime's own packages (what changes between vime deployments)
serves that purpose, and reading them takes milliseconds.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("vime", "workflows", "activities", "workers")


@functools.cache
def code_build_id() -> str:
    """`vime-<16 hex digits>`: the sha256 of every `.py` file (path and content) in vime's packages."""
    digest = hashlib.sha256()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(path.read_bytes())
    return f"vime-{digest.hexdigest()[:16]}"
