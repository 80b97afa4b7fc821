"""Weights made ready to push: CPU tensors with no aliases, written once as a safetensors file
(atomically, with the weight version in its metadata), and what one sync cost (`SyncReport`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vime.engine.weight_sync.live_weights import VERSION_KEY
from vime.engine.weight_sync.protocol import TIED_EMBEDDING, TIED_LM_HEAD
from vime.errors import ConfigError


@dataclass
class SyncReport:
    """What one sync cost. `pause_seconds`: from the first `/pause` to the last `/resume`
    answered (generation stopped); `total_seconds`: from `stage` (or `sync`) called to `push`
    done, so it includes writing the file (`write_seconds`) and any wait between the two."""

    weight_version: int
    bytes: int
    pause_seconds: float
    total_seconds: float
    write_seconds: float = 0.0
    urls: list[str] = field(default_factory=list)
    engine: str = "file"
    changed: int = 0
    """Elements sent: all of them in a dense sync, the ones whose bits changed in a delta."""
    total: int = 0
    wire_bytes: int = 0
    """Bytes each server received: the file's size, or the broadcast's payload."""
    delta: bool = False


@dataclass
class StagedWeights:
    """Weights prepared and not yet pushed (`WeightSync.stage`); push them once. The file engine
    has written `path`; the collective engine holds `planned` (dense tensors and delta patches)
    in memory. `tensors` are the full weights, kept for delta mode's record."""

    path: Path | None
    num_tensors: int
    bytes: int
    weight_version: int
    write_seconds: float
    started: float
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    planned: dict[str, Any] = field(default_factory=dict)
    changed: int = 0
    total: int = 0
    base_version: int | None = None


def prepare_tensors(state_dict: Mapping[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """CPU, contiguous, detached tensors with no shared memory (safetensors refuses aliases).

    `lm_head.weight` aliasing the embedding (a tied model: transformers' `state_dict()` lists
    both) is left out, since vLLM ties it itself; any other alias is copied.
    """
    emb, head = state_dict.get(TIED_EMBEDDING), state_dict.get(TIED_LM_HEAD)
    tied = emb is not None and head is not None and head.data_ptr() == emb.data_ptr() and head.shape == emb.shape
    out: dict[str, torch.Tensor] = {}
    seen: set[tuple[int, tuple[int, ...]]] = set()
    for name, tensor in state_dict.items():
        if not isinstance(tensor, torch.Tensor):
            raise ConfigError(f"weight sync: state dict entry {name!r} is a {type(tensor).__name__}, not a tensor")
        if tied and name == TIED_LM_HEAD:
            continue
        t = tensor.detach()
        key = (t.data_ptr(), tuple(t.shape))
        if key in seen and t.numel():
            t = t.clone()
        seen.add(key)
        if dtype is not None and t.is_floating_point():
            t = t.to(dtype)
        out[name] = t.to("cpu").contiguous()
    if not out:
        raise ConfigError("weight sync: the state dict is empty; pass model.state_dict()")
    return out


def write_weights_file(tensors: dict[str, torch.Tensor], path: Path, weight_version: int | None = None) -> int:
    """Write `tensors` to `path` atomically (a reader never sees a partial file); returns bytes.
    The weight version goes into the file's metadata (see `live_weights.py`)."""
    from safetensors.torch import save_file

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    metadata = {VERSION_KEY: str(weight_version)} if weight_version is not None else None
    try:
        save_file(tensors, str(tmp), metadata=metadata)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path.stat().st_size
