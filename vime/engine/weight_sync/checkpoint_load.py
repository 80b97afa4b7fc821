"""A saved checkpoint's weights pushed into running vLLM servers, for `vime eval`.

A vime checkpoint (`vime/train/checkpoint.py`) is an HF model directory whose weights are one
`model.safetensors` file: exactly the file the file weight-sync engine loads. So loading a
checkpoint is a weight sync from a file that already exists: the servers are paused, load it
through vime's worker extension (`vllm_file.py`), are told its policy version and resume; the
file is read in place, never copied or removed. The servers then report that version on every
response, which is how an eval round checks each of its samples came from this checkpoint.

The push is the trainer's own (`WeightSync.push`), so the servers must run vime's worker
extension (`weight_sync_server_args()`), as they do under `vime train` and `vime eval`.
"""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path
from typing import Any

from vime.engine.weight_sync.live_weights import WEIGHTS_FILE
from vime.errors import ConfigError, ServiceError


def engine_urls(args: Any) -> list[str]:
    """The servers to push weights to: --vllm-server-urls, else the one --vllm-router-ip/port names."""
    if args.vllm_server_urls:
        return list(args.vllm_server_urls)
    if args.vllm_router_ip and args.vllm_router_port:
        return [f"http://{args.vllm_router_ip}:{args.vllm_router_port}"]
    raise ServiceError("no vLLM server to push weights to: pass --vllm-server-urls "
                       "(or --vllm-router-ip/--vllm-router-port naming the one server)")


def weights_file(checkpoint: str | Path) -> Path:
    """The one safetensors file of a checkpoint directory (`ConfigError` when there is none, or
    the weights are sharded over several files: those load only as a server's boot model)."""
    path = Path(checkpoint)
    file = path / WEIGHTS_FILE
    if file.is_file():
        return file
    shards = sorted(p.name for p in path.glob("*.safetensors"))
    if shards:
        raise ConfigError(f"checkpoint {path}: its weights are sharded ({', '.join(shards[:3])}...); vime eval loads "
                          f"one {WEIGHTS_FILE} into running servers: evaluate it with servers vime starts on it "
                          "(vime eval --hf-checkpoint without --vllm-router-ip)")
    raise ConfigError(f"checkpoint {path}: no {WEIGHTS_FILE} in it; pass a vime checkpoint (step_*) or an HF model "
                      "directory")


def tensor_count(file: Path) -> int:
    """How many tensors a safetensors file holds (its JSON header only): the push's torn-file guard."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(size))
    return sum(1 for key in header if key != "__metadata__")


async def load_checkpoint_weights(urls: list[str], checkpoint: str | Path, weight_version: int) -> dict[str, Any]:
    """Push `checkpoint`'s weights into every server of `urls` as policy `weight_version`;
    returns the push's figures. Idempotent: pushing the same checkpoint again loads it again."""
    from vime.engine.weight_sync.staging import StagedWeights
    from vime.engine.weight_sync.sync import WeightSync

    file = weights_file(checkpoint)
    staged = StagedWeights(path=file, num_tensors=tensor_count(file), bytes=file.stat().st_size,
                           weight_version=int(weight_version), write_seconds=0.0, started=time.perf_counter())
    async with WeightSync(urls, keep_files=True) as sync:  # keep: the file is the checkpoint's own
        await sync.init_servers()
        report = await sync.push(staged)
    return {"weight_version": report.weight_version, "bytes": report.bytes, "servers": len(urls),
            "pause_seconds": report.pause_seconds, "seconds": report.total_seconds}
