"""What vime's trainer side and its vLLM worker side agree on: the backend names, the
worker-extension class path, the tied-weight names, and the server flags that load them.

No torch import: the launcher (`vime train`, `vime engine`) builds server flags with it.
"""

from __future__ import annotations

from typing import Literal

from vime.errors import ConfigError

SHM_BACKEND = "vime_shm"
COLLECTIVE_BACKEND = "vime_collective"
BACKENDS = {"file": SHM_BACKEND, "collective": COLLECTIVE_BACKEND}
EXTENSION_CLS = "vime.engine.weight_sync.vllm_extension.WeightTransferExtension"
TIED_LM_HEAD = "lm_head.weight"
TIED_EMBEDDING = "model.embed_tokens.weight"

PauseMode = Literal["keep", "abort"]
SyncEngine = Literal["file", "collective"]
UpdateMode = Literal["full", "delta"]


def weight_sync_server_args(engine: SyncEngine = "file") -> list[str]:
    """vLLM server flags that load vime's weight-transfer engine: `file` (`vime_shm`, the
    default) or `collective` (`vime_collective`, see `vime.engine.weight_sync.collective`)."""
    if engine not in BACKENDS:
        raise ConfigError(f"weight sync engine {engine!r} is not one of {', '.join(BACKENDS)}")
    return ["--worker-extension-cls", EXTENSION_CLS,
            "--weight-transfer-config", '{"backend": "%s"}' % BACKENDS[engine]]
