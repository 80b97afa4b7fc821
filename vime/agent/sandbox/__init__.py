"""Sandboxes for agent rollouts: the `Sandbox` protocol and its backends, chosen by name.

`make_sandbox(args.sandbox_backend, repo_dir=...)` is how rollout code gets one; nothing else
in vime names a backend class, so a new provider is one module plus one line in `BACKENDS`.
See docs/sandbox-backends.md.
"""

from __future__ import annotations

import importlib
from typing import Any

from vime.agent.sandbox.base import (
    WORKDIR,
    CommandError,
    CommandFailed,
    CommandTimeout,
    ExecResult,
    Sandbox,
    SandboxError,
)
from vime.errors import ConfigError

BACKENDS: dict[str, str] = {
    "bwrap": "vime.agent.sandbox.bwrap:BwrapSandbox",
    "e2b": "vime.agent.sandbox.e2b:E2BSandbox",
}
"""`--sandbox-backend` name -> "module:Class". Imported lazily: the e2b SDK is optional."""


def make_sandbox(backend: str, **kwargs: Any) -> Sandbox:
    """A not-yet-entered sandbox of the named backend; `kwargs` go to its constructor."""
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(
            f"--sandbox-backend {backend!r}: unknown backend; choose one of {sorted(BACKENDS)}"
        ) from None
    module_name, _, cls_name = target.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)(**kwargs)


def __getattr__(name: str) -> Any:
    if name in ("BwrapSandbox", "E2BSandbox"):
        module = "bwrap" if name == "BwrapSandbox" else "e2b"
        return getattr(importlib.import_module(f"vime.agent.sandbox.{module}"), name)
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
    "Sandbox",
    "SandboxError",
    "make_sandbox",
]
