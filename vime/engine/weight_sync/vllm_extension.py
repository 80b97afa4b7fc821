"""The class vime passes to vLLM as `--worker-extension-cls` (`weight_sync_server_args()`).

vLLM imports it in every worker before the model loads; importing this module registers both of
vime's weight-transfer engines with `WeightTransferEngineFactory`: `vime_shm` (`vllm_file`) and
`vime_collective` (`vllm_collective`). `--weight-transfer-config` picks one.
"""

from __future__ import annotations

import vime.engine.weight_sync.vllm_collective  # noqa: F401  registers vime_collective
import vime.engine.weight_sync.vllm_file  # noqa: F401  registers vime_shm
from vime.engine.weight_sync.vllm_reload import repack_tied_lm_heads, set_lm_head_repack


class WeightTransferExtension:
    """Mixed into vLLM's worker class (`--worker-extension-cls`); reachable via `/collective_rpc`.

    Importing this module is what matters (it registers the engines); the methods are for
    `/collective_rpc` users. Names carry a `vime_` prefix: vLLM refuses an extension whose
    attributes collide with the worker's.
    """

    def vime_repack_tied_lm_heads(self) -> int:
        """Re-pack tied LM heads; call after `/collective_rpc reload_weights`, which skips it."""
        return repack_tied_lm_heads(self.model_runner.get_model())  # type: ignore[attr-defined]

    def vime_set_lm_head_repack(self, enabled: str | bool) -> bool:
        """Diagnostic: turn the tied-LM-head re-pack after updates off ("false") or on ("true")."""
        return set_lm_head_repack(str(enabled).lower() in ("1", "true", "yes", "on"))
