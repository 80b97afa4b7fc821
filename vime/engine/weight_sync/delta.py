"""Delta weight updates (`--update-weight-mode delta`): ship only the elements whose bits changed.

A sync in delta mode sends, per tensor, the flat int32 indices of the elements whose bits (in
the wire dtype, usually bf16) differ from the last sync, and their new values. An optimizer
step at a small learning rate leaves most bf16 values bit-identical, so the wire carries a
fraction of the model.

Both ends keep the last synced tensors in the wire dtype: the trainer (`DeltaTracker`) to know
what changed, each server worker (`ShadowWeights`) to rebuild full tensors from a patch. The
server cannot patch its own parameters instead: vLLM fuses them (qkv, gate_up), may re-pack them
for the CPU gemm, and the layerwise reload wants every weight of a layer in checkpoint format
before it re-processes the layer. So the server loads the rebuilt full tensors through the
model's `load_weights`, exactly as a dense sync would: a delta sync and a dense sync of the same
weights leave bit-identical models. Only the wire shrinks; the load costs what it did.

Invariants:
- A delta is applied only on top of the version it was computed against (`base_version`); a
  server whose shadow is of another version (restarted, or its last update failed) refuses it
  before loading anything, and the trainer's next sync is dense.
- The trainer's record advances only after every server took the sync (`commit`); a failed
  sync forgets it (`reset`), so the next one is dense.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

INDEX_DTYPE = torch.int32
PATCH_INDICES = ".__delta_indices__"
"""In a weights file, a patched tensor `name` is stored as `name + PATCH_INDICES` and `name + PATCH_VALUES`."""
PATCH_VALUES = ".__delta_values__"
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass
class Patch:
    """New `values` at flat `indices` (int32) of one tensor of `numel` elements (None: not said)."""

    indices: torch.Tensor
    values: torch.Tensor
    numel: int | None = None

    @property
    def nbytes(self) -> int:
        return self.indices.numel() * self.indices.element_size() + self.values.numel() * self.values.element_size()


def changed_elements(old: torch.Tensor, new: torch.Tensor) -> Patch:
    """The elements of `new` whose bits differ from `old` (same shape and dtype).

    Bits, not values: -0.0 vs 0.0 and NaN payloads count as changes, so applying the patch
    reproduces `new` exactly.
    """
    if old.shape != new.shape or old.dtype != new.dtype:
        raise ValueError(f"delta: shape/dtype changed ({tuple(old.shape)} {old.dtype} -> "
                         f"{tuple(new.shape)} {new.dtype}); send this tensor dense")
    if new.numel() >= 2**31:
        raise ValueError(f"delta: a tensor of {new.numel()} elements does not fit int32 indices")
    bits = _BITS[new.element_size()]
    flat_new = new.reshape(-1)
    mask = old.reshape(-1).view(bits) != flat_new.view(bits)
    indices = mask.nonzero().reshape(-1).to(INDEX_DTYPE)
    return Patch(indices=indices, values=flat_new[indices.long()], numel=new.numel())


def apply_patch(base: torch.Tensor, patch: Patch) -> None:
    """Write `patch` into `base` in place (`base` is the last synced tensor)."""
    if patch.numel is not None and base.numel() != patch.numel:
        raise ValueError(f"delta: patch for {patch.numel} elements applied to a tensor of {base.numel()}")
    base.view(-1)[patch.indices.long()] = patch.values.to(base.dtype)


@dataclass
class DeltaStats:
    changed: int = 0
    total: int = 0


class DeltaTracker:
    """Trainer side: the last synced tensors (wire dtype, CPU), and the patches against them.

    `plan(tensors)` returns, per name, the tensor itself (dense: first sync, a tensor that is
    new or changed shape, or one whose patch would not be smaller than it) or a `Patch`; `commit` makes `tensors` the new base once every
    server took them, `reset` forgets the base (the next plan is dense).
    """

    def __init__(self) -> None:
        self.base: dict[str, torch.Tensor] | None = None
        self.base_version: int | None = None

    def plan(self, tensors: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor | Patch], DeltaStats]:
        stats = DeltaStats()
        out: dict[str, torch.Tensor | Patch] = {}
        base = self.base if self.base is not None and set(self.base) == set(tensors) else None
        for name, t in tensors.items():
            stats.total += t.numel()
            old = base.get(name) if base is not None else None
            if old is None or old.shape != t.shape or old.dtype != t.dtype:
                out[name] = t
                stats.changed += t.numel()
                continue
            patch = changed_elements(old, t)
            stats.changed += patch.indices.numel()
            # 4 index bytes per changed element: past a share of the tensor the patch is the bigger
            # payload (every element of a float32 wire moves under Adam), so the tensor goes whole
            out[name] = t if patch.nbytes >= t.numel() * t.element_size() else patch
        return out, stats

    def is_delta(self, planned: Mapping[str, torch.Tensor | Patch]) -> bool:
        return any(isinstance(p, Patch) for p in planned.values())

    def commit(self, tensors: Mapping[str, torch.Tensor], version: int,
               planned: Mapping[str, torch.Tensor | Patch] | None = None) -> None:
        """`tensors` were just synced: they become the base (copied: the trainer steps in place).
        With the `planned` they were sent as, the base is patched instead of copied whole."""
        if planned is None or self.base is None or set(planned) != set(self.base):
            self.base = {n: t.detach().clone() for n, t in tensors.items()}
        else:
            for name, item in planned.items():
                if isinstance(item, Patch):
                    apply_patch(self.base[name], item)
                else:
                    self.base[name] = tensors[name].detach().clone()
        self.base_version = version

    def reset(self) -> None:
        self.base, self.base_version = None, None


class ShadowWeights:
    """Server-worker side: the last synced checkpoint-format tensors, kept only in delta mode.

    `version` is the weight version they hold, None when there is no complete set (nothing kept
    yet, or an update failed midway). `expect(base_version)` raises before anything is loaded
    when a delta does not apply to what this worker holds.
    """

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self.version: str | None = None

    def expect(self, base_version: str | int) -> None:
        if self.version is None or str(base_version) != self.version:
            raise RuntimeError(
                f"delta update against weight version {base_version}, but this server holds "
                f"{'no kept weights' if self.version is None else 'version ' + self.version}; the trainer "
                "must send the next update dense (it does after a failed sync)"
            )

    def keep(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        self.tensors[name] = tensor
        return tensor

    def patched(self, name: str, patch: Patch) -> torch.Tensor:
        base = self.tensors.get(name)
        if base is None:
            raise RuntimeError(f"delta update patches {name!r}, which this server was never sent dense")
        apply_patch(base, patch)
        return base

    def start(self) -> None:
        """An update begins: the kept set is incomplete until `finish`."""
        self.version = None

    def finish(self, version: str | None) -> None:
        self.version = version

    def clear(self) -> None:
        self.tensors.clear()
        self.version = None


def iter_payload(planned: Mapping[str, torch.Tensor | Patch]) -> Iterator[torch.Tensor]:
    """The byte views to put on the wire, in order: a dense tensor, or a patch's indices then values."""
    for item in planned.values():
        if isinstance(item, Patch):
            yield item.indices
            yield item.values
        else:
            yield item


def payload_nbytes(item: torch.Tensor | Patch) -> int:
    return item.nbytes if isinstance(item, Patch) else item.numel() * item.element_size()


def file_entries(planned: Mapping[str, torch.Tensor | Patch]) -> dict[str, torch.Tensor]:
    """`planned` as the tensors of a weights file: dense ones by name, a patch as two entries."""
    out: dict[str, torch.Tensor] = {}
    for name, item in planned.items():
        if isinstance(item, Patch):
            out[name + PATCH_INDICES], out[name + PATCH_VALUES] = item.indices, item.values
        else:
            out[name] = item
    return out
