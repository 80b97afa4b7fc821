"""Sandboxes for agent rollouts: the `Sandbox` protocol and its backends, chosen by name.

`make_sandbox(args.sandbox_backend, repo_dir=...)` is how rollout code gets one, and
`attach_sandbox(backend, sandbox_id, ...)` how a later activity gets a handle to one booted
earlier; nothing else in vime names a backend class, so a new provider is one module plus one
line in `BACKENDS`. See docs/sandbox-backends.md. `run_program` runs a program in a fresh
sandbox and grades it (passed / failed / error / timeout, with a reason): see `programs.py`.
"""

from __future__ import annotations

import importlib
from typing import Any

from vime.sandbox.base import (
    WORKDIR,
    CommandError,
    CommandFailed,
    CommandTimeout,
    ExecResult,
    Sandbox,
    SandboxError,
    SandboxGone,
)
from vime.sandbox.backends import BACKENDS, attach_sandbox, make_sandbox
from vime.sandbox.programs import OUTCOMES, ProgramResult, run_program

def __getattr__(name: str) -> Any:
    if name in ("BwrapSandbox", "E2BSandbox"):
        module = "bwrap" if name == "BwrapSandbox" else "e2b"
        return getattr(importlib.import_module(f"vime.sandbox.{module}"), name)
    raise AttributeError(name)


__all__ = [
    "BACKENDS",
    "WORKDIR",
    "BwrapSandbox",
    "CommandError",
    "CommandFailed",
    "CommandTimeout",
    "E2BSandbox",
    "ExecResult",
    "OUTCOMES",
    "ProgramResult",
    "Sandbox",
    "SandboxError",
    "SandboxGone",
    "attach_sandbox",
    "make_sandbox",
    "run_program",
]
