"""vLLM worker side of the collective weight-sync engine (backend `vime_collective`).

Registered with vLLM's `WeightTransferEngineFactory` when vLLM imports vime's worker extension
(`vllm_extension.py` imports this module), and chosen with
`--weight-transfer-config '{"backend": "vime_collective"}'` (`weight_sync_server_args("collective")`).

`/init_weight_transfer_engine` joins the trainer's group (`collective.py`): the
worker's rank is the server's `rank_offset` plus its rank among the server's workers; the
call returns once every rank joined, or fails after `timeout_s` with the address it tried.
`/update_weights` carries the names, dtypes and shapes (and, in delta mode, each patch's
length) and blocks while the trainer broadcasts the bytes; the tensors go through the same
layerwise reload, failure handling, delta shadow and tied-LM-head re-pack as the file engine
(`LayerwiseReloadEngine`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
from vllm.logger import init_logger

from vime.engine.weight_sync.collective import (
    DEFAULT_BUCKET_BYTES,
    Rendezvous,
    join_group,
    open_store,
    receive_pieces,
)
from vime.engine.weight_sync.vllm_reload import LayerwiseReloadEngine
from vime.engine.weight_sync.delta import INDEX_DTYPE, Patch
from vime.engine.weight_sync.protocol import COLLECTIVE_BACKEND

logger = init_logger(__name__)


@dataclass
class CollectiveInitInfo(WeightTransferInitInfo):
    """The trainer's TCPStore (`host`:`port`), the group's key `prefix`, and this server's place."""

    host: str
    port: int
    world_size: int
    rank_offset: int
    prefix: str
    timeout_s: float = 60.0


@dataclass
class CollectiveUpdateInfo(WeightTransferUpdateInfo):
    """What the broadcast carries, in order. `counts[i]` is None for a dense tensor, else the
    number of changed elements of a patch (indices then values on the wire). `keep`, `version`,
    `base_version`: delta mode, as in `ShmUpdateInfo`."""

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    counts: list[int | None] = field(default_factory=list)
    bucket_bytes: int = DEFAULT_BUCKET_BYTES
    keep: bool = False
    version: str | None = None
    base_version: str | None = None

    def piece_sizes(self) -> list[int]:
        sizes: list[int] = []
        counts = self.counts or [None] * len(self.names)
        for dtype_name, shape, count in zip(self.dtype_names, self.shapes, counts):
            itemsize = getattr(torch, dtype_name).itemsize
            if count is None:
                sizes.append(int(torch.Size(shape).numel()) * itemsize)
            else:
                sizes += [count * INDEX_DTYPE.itemsize, count * itemsize]
        return sizes


class CollectiveWeightTransferEngine(LayerwiseReloadEngine,
                                     WeightTransferEngine[CollectiveInitInfo, CollectiveUpdateInfo]):
    """Receives the trainer's bucketed broadcast and loads it through vLLM's layerwise reload."""

    init_info_cls = CollectiveInitInfo
    update_info_cls = CollectiveUpdateInfo

    group: dist.ProcessGroup | None = None

    def init_transfer_engine(self, init_info: CollectiveInitInfo) -> None:
        self.shutdown()
        pc = self.parallel_config
        rank = init_info.rank_offset + pc.data_parallel_index * pc.world_size + pc.rank
        rz = Rendezvous(init_info.host, init_info.port, init_info.world_size, init_info.prefix, init_info.timeout_s)
        try:
            store = open_store(rz.host, rz.port, is_master=False, world_size=rz.world_size, timeout_s=rz.timeout_s)
            self.group = join_group(store, rz, rank, self.device)
        except Exception as e:
            raise RuntimeError(
                f"vime_collective: rank {rank} of {rz.world_size} could not join the trainer's weight-sync "
                f"group at {rz.host}:{rz.port} within {rz.timeout_s:g} s ({str(e).splitlines()[0][:200]}); "
                "can this server reach the trainer's host and port?"
            ) from None
        logger.info("vime_collective: rank %d of %d joined %s:%d", rank, rz.world_size, rz.host, rz.port)

    def receive_weights(self, update_info: CollectiveUpdateInfo) -> None:
        with self._restoring_on_early_failure():
            if self.group is None:
                raise RuntimeError("vime_collective: /update_weights before /init_weight_transfer_engine")
            self._begin(update_info.keep, update_info.version, update_info.base_version)
        keep = update_info.keep
        group, device = self.group, self.device

        def tensors():
            pieces = receive_pieces(group, update_info.piece_sizes(), update_info.bucket_bytes, device)
            counts = update_info.counts or [None] * len(update_info.names)
            for name, dtype_name, shape, count in zip(update_info.names, update_info.dtype_names,
                                                      update_info.shapes, counts):
                dtype = getattr(torch, dtype_name)
                if count is None:
                    item: torch.Tensor | Patch = next(pieces).view(dtype).reshape(shape)
                else:
                    indices = next(pieces).view(INDEX_DTYPE)
                    item = Patch(indices, next(pieces).view(dtype), int(torch.Size(shape).numel()))
                yield name, self._resolve(name, item, keep)

        loaded = self._load(tensors())
        logger.info("vime_collective: loaded %d tensors", loaded)

    def shutdown(self) -> None:
        self.group = None  # the process group closes its connections when collected


def _register() -> None:
    try:
        WeightTransferEngineFactory.register_engine(COLLECTIVE_BACKEND, CollectiveWeightTransferEngine)
    except ValueError:  # already registered
        pass


_register()
