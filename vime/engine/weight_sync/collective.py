"""The wire of the collective weight-sync engine: one `torch.distributed` group, bucketed broadcasts.

The trainer is rank 0 of a group it creates for weight sync alone (its own TCPStore, not the
default process group, which the trainer's ranks and vLLM's workers each already have);
every vLLM worker of every server joins it (`/init_weight_transfer_engine` hands them the
store's address, their rank offset and the world size). Gloo on CPU, NCCL on GPU: the same
calls, the backend follows the device.

A sync is a sequence of pieces (byte views of tensors, or of a delta patch's indices and
values) that both sides know the sizes of from the update's metadata. The sender copies
pieces into a bucket of `bucket_bytes` and broadcasts each full bucket (the last may be
shorter); the receiver slices the pieces back out. So memory on both sides is one bucket plus
the tensor being assembled, whatever the model's size.

The worker side is `vllm_collective.py`; the trainer side's driver is
`WeightSync(engine="collective")` in `sync.py`.
"""

from __future__ import annotations

import datetime
import socket
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

DEFAULT_BUCKET_BYTES = 64 << 20


@dataclass
class Rendezvous:
    """Where and how to join: the trainer's TCPStore, the group's key prefix, its size."""

    host: str
    port: int
    world_size: int
    prefix: str
    timeout_s: float


def local_ip_toward(host: str) -> str:
    """This host's address on the route to `host` (no packet is sent): the address gloo listens on."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return s.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def open_store(host: str, port: int, *, is_master: bool, world_size: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, world_size, is_master=is_master, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=timeout_s))


def join_group(store: dist.Store, rz: Rendezvous, rank: int, device: torch.device) -> dist.ProcessGroup:
    """Create this rank's end of the weight-sync group; blocks until every rank joined (or timeout)."""
    prefixed = dist.PrefixStore(rz.prefix, store)
    timeout = datetime.timedelta(seconds=rz.timeout_s)
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, rz.world_size, opts)
    opts = dist.ProcessGroupGloo._Options()
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_ip_toward(rz.host))]
    group = dist.ProcessGroupGloo(prefixed, rank, rz.world_size, opts)
    broadcast(group, torch.zeros(1, dtype=torch.uint8))  # every rank connected, or a timeout here
    return group


def broadcast(group: dist.ProcessGroup, tensor: torch.Tensor) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    group.broadcast([tensor], opts).wait()


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def send_pieces(group: dist.ProcessGroup, pieces: Iterable[torch.Tensor], total: int, bucket_bytes: int,
                device: torch.device) -> int:
    """Broadcast the concatenated bytes of `pieces` (`total` of them) bucket by bucket; returns buckets sent."""
    if total == 0:
        return 0
    bucket = torch.empty(min(bucket_bytes, total), dtype=torch.uint8, device=device)
    fill = sent = buckets = 0
    for piece in pieces:
        data = as_bytes(piece)
        done = 0
        while done < data.numel():
            n = min(data.numel() - done, bucket.numel() - fill)
            bucket[fill:fill + n].copy_(data[done:done + n])
            fill, done = fill + n, done + n
            if fill == min(bucket.numel(), total - sent):
                broadcast(group, bucket[:fill])
                sent, fill, buckets = sent + fill, 0, buckets + 1
    if sent != total:
        raise RuntimeError(f"collective weight sync: sent {sent} bytes, the metadata announced {total}")
    return buckets


def receive_pieces(group: dist.ProcessGroup, sizes: Sequence[int], bucket_bytes: int,
                   device: torch.device) -> Iterator[torch.Tensor]:
    """The pieces `send_pieces` broadcast, as fresh uint8 tensors of `sizes` bytes, in order."""
    total = sum(sizes)
    bucket = torch.empty(min(bucket_bytes, max(total, 1)), dtype=torch.uint8, device=device)
    received = length = offset = 0
    for size in sizes:
        out = torch.empty(size, dtype=torch.uint8, device=device)
        filled = 0
        while filled < size:
            if offset == length:
                length = min(bucket.numel(), total - received)
                broadcast(group, bucket[:length])
                received, offset = received + length, 0
            n = min(size - filled, length - offset)
            out[filled:filled + n].copy_(bucket[offset:offset + n])
            filled, offset = filled + n, offset + n
        yield out


class SyncGroup:
    """Trainer side: rank 0 of one weight-sync group, from rendezvous to the last broadcast.

    `init_info(rank_offset)` is what one server's `/init_weight_transfer_engine` gets; `join()`
    (blocking: run it in a thread while those requests are in flight) returns once every
    worker joined, or raises after `timeout_s`. A group whose join or broadcast failed is
    spent: make a new one (the servers join the new one on their next init).
    """

    def __init__(self, world_size: int, *, advertise_host: str | None = None, timeout_s: float = 60.0,
                 device: torch.device | str = "cpu") -> None:
        import secrets

        host = advertise_host or local_ip_toward("8.8.8.8")
        self.store = open_store("0.0.0.0", 0, is_master=True, world_size=world_size, timeout_s=timeout_s)
        self.rendezvous = Rendezvous(host, self.store.port, world_size, f"vime-weights-{secrets.token_hex(4)}",
                                     timeout_s)
        self.device = torch.device(device)
        self.group: dist.ProcessGroup | None = None

    def init_info(self, rank_offset: int) -> dict:
        rz = self.rendezvous
        return {"host": rz.host, "port": rz.port, "world_size": rz.world_size, "rank_offset": rank_offset,
                "prefix": rz.prefix, "timeout_s": rz.timeout_s}

    def join(self) -> None:
        self.group = join_group(self.store, self.rendezvous, 0, self.device)

    def send(self, pieces: Iterable[torch.Tensor], total: int, bucket_bytes: int) -> int:
        if self.group is None:
            raise RuntimeError("collective weight sync: send before join")
        return send_pieces(self.group, pieces, total, bucket_bytes, self.device)

    def close(self) -> None:
        self.group = None
