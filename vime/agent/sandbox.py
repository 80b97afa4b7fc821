"""`vime.agent.sandbox`: the import path the seed page (upstream vime's agent roadmap) gives for
sandboxes: `vime.agent.sandbox.Sandbox`, the provider-neutral protocol, and
`vime.agent.sandbox.E2BSandbox`, the backend for E2B-compatible services.

The sandboxes live in `vime.sandbox` (they serve tool use and grading too, not only agents);
this module hands out the very same objects (every name in `vime.sandbox.__all__`, so the
two cannot drift apart), so `isinstance` checks, `except SandboxError` and
a backend registered in `vime.sandbox.BACKENDS` mean the same under either path. Backends load
on first use, as there: the e2b SDK is optional.
"""

from __future__ import annotations

from typing import Any

import vime.sandbox as _sandbox

_LAZY = ("BwrapSandbox", "E2BSandbox")
globals().update({name: getattr(_sandbox, name) for name in _sandbox.__all__ if name not in _LAZY})


def __getattr__(name: str) -> Any:
    """`E2BSandbox` and `BwrapSandbox`, imported from `vime.sandbox` when first named."""
    if name in _LAZY:
        return getattr(_sandbox, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = list(_sandbox.__all__)
