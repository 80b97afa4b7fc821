"""Backends by name: `make_sandbox` and `attach_sandbox` are how rollout code gets a sandbox;
nothing else in vime names a backend class, so a new provider is one module plus one line in
`BACKENDS` (see docs/sandbox-backends.md)."""

from __future__ import annotations

import importlib
from typing import Any

from vime.errors import ConfigError
from vime.sandbox.base import Sandbox

BACKENDS: dict[str, str] = {
    "bwrap": "vime.sandbox.bwrap:BwrapSandbox",
    "e2b": "vime.sandbox.e2b:E2BSandbox",
}
"""`--sandbox-backend` name -> "module:Class". Imported lazily: the e2b SDK is optional."""


def make_sandbox(backend: str, **kwargs: Any) -> Sandbox:
    """A not-yet-booted sandbox of the named backend; `kwargs` go to its constructor."""
    return _backend_class(backend)(**kwargs)


async def attach_sandbox(backend: str, sandbox_id: str, **kwargs: Any) -> Sandbox:
    """A handle to the running sandbox `sandbox_id`, booted earlier by this or another process.

    `kwargs` are the ones the sandbox was made with (limits, `base_dir`, credentials). Raises
    `SandboxGone` if it was destroyed, reaped or expired.
    """
    return await _backend_class(backend).attach(sandbox_id, **kwargs)


def _backend_class(backend: str) -> type:
    try:
        target = BACKENDS[backend]
    except KeyError:
        raise ConfigError(
            f"--sandbox-backend {backend!r}: unknown backend; choose one of {sorted(BACKENDS)}"
        ) from None
    module_name, _, cls_name = target.partition(":")
    return getattr(importlib.import_module(module_name), cls_name)
