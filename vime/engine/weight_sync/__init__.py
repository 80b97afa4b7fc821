"""Weight sync: the trainer's weights pushed into running vLLM servers, one job a module.

Trainer side: `sync.py` (`WeightSync`: pause, push, resume), `staging.py` (tensors made ready, the
safetensors file), `delta.py` (delta mode: only the changed elements), `collective.py` (the
torch.distributed wire), `verify.py` (`verify_sync`: the server's logprobs against the
trainer's) and `live_weights.py` (the copy a restarted server boots from).

vLLM worker side, loaded by `--worker-extension-cls` (`protocol.EXTENSION_CLS`): `vllm_extension.py`
registers `vllm_file.py` (backend `vime_shm`) and `vllm_collective.py` (`vime_collective`), which
share `vllm_reload.py` (layerwise reload, tied-LM-head re-pack). `protocol.py` holds what both
sides agree on, without torch.

This package's `__init__` imports nothing: the launcher reads `protocol` and `live_weights`
without loading torch.
"""
