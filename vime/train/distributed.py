"""torch.distributed set-up for the trainer: gloo on CPU, NCCL on GPU, one rank by default.

A trainer is a process group launched by torchrun (or a single process). Rank 0 serves the
trainer's Temporal task queue and drives the others: it broadcasts each command, and every
rank executes it, so the collectives inside FSDP2 line up.
"""

from __future__ import annotations

import collections
import os
import pickle
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
        _wait(dist.barrier(async_op=True))
    dist.destroy_process_group()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def broadcast_object(obj: Any = None, src: int = 0) -> Any:
    """Rank `src` sends `obj`; every rank returns it (small, picklable commands only)."""
    if world_size() == 1:
        return obj
    device = _device()
    payload = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8) if rank() == src else None
    size = torch.tensor([payload.numel() if payload is not None else 0], dtype=torch.int64, device=device)
    _wait(dist.broadcast(size, src=src, async_op=True))
    if payload is None:
        payload = torch.empty(int(size.item()), dtype=torch.uint8)
    data = payload.to(device)
    _wait(dist.broadcast(data, src=src, async_op=True))
    return obj if rank() == src else pickle.loads(data.cpu().numpy().tobytes())


def all_reduce_sum(values: dict[str, float]) -> dict[str, float]:
    """Sum a dict of scalars over ranks (every rank must pass the same keys in the same order)."""
    if world_size() == 1 or not values:
        return dict(values)
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=_device())
    _wait(dist.all_reduce(t, async_op=True))
    return dict(zip(keys, t.tolist()))


def _device() -> str:
    """Where a collective's tensors live: gloo takes CPU tensors, NCCL CUDA ones."""
    return "cuda" if torch.cuda.is_available() else "cpu"


# The last collectives' work objects (each holds its tensors), kept by this thread: see `_wait`.
_held: collections.deque = collections.deque(maxlen=8)


def _wait(work: Any) -> None:
    """Wait for a collective, keeping its work object so that gloo's worker thread never frees it.

    The thread that drops a work object last frees its tensors, and freeing a tensor that Python
    once saw takes the GIL. When that is gloo's worker thread, late on a loaded machine, and the
    interpreter is already finalizing, the thread is made to exit inside a C++ destructor and the
    process aborts ("terminate called without an active exception", the two-rank test 3 in 40
    under load; the core showed `~AsyncBroadcastWork` in `ProcessGroupGloo::runLoop`). Kept here,
    the worker's release is a counter decrement, and this thread frees them later, holding the GIL.
    """
    work.wait()
    _held.append(work)
