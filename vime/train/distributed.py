"""torch.distributed set-up for the trainer: gloo on CPU, NCCL on GPU, one rank by default.

A trainer is a process group launched by torchrun (or a single process). Rank 0 serves the
trainer's Temporal task queue and drives the others: it broadcasts each command, and every
rank executes it, so the collectives inside FSDP2 line up.
"""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.distributed as dist


def init_distributed() -> torch.device:
    """Join (or create) the default process group; return this rank's device.

    Without torchrun's environment this becomes a one-rank group over an in-memory store (no
    port to race for), so the same FSDP2 code path runs in tests and on a laptop.
    """
    if not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if "RANK" in os.environ:
            dist.init_process_group(backend)
        else:
            os.environ.setdefault("LOCAL_RANK", "0")
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def shutdown() -> None:
    """Leave the process group on every rank together (a barrier, then destroy).

    A rank that exits with its group alive can abort in the gloo/NCCL threads' teardown
    ("terminate called without an active exception", exit -6) while the others still talk to it.
    """
    if not dist.is_initialized():
        return
    if dist.get_world_size() > 1:
        dist.barrier()
    dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """Rank `src` sends `obj`; every rank returns it (small, picklable commands only)."""
    if world_size() == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum a dict of scalars over ranks (every rank must pass the same keys in the same order)."""
    if world_size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64,
                     device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))
