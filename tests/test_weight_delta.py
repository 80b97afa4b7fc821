"""Delta updates and the collective wire, without a vLLM server.

A patch reproduces the new tensor bit for bit; the trainer's record sends dense until a sync
was committed and again after a reset; a server worker refuses a delta against weights it
does not hold. The bucketed broadcast delivers every piece intact to every receiver, pieces
larger than a bucket and empty ones included, over a real gloo group of three processes.
"""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from vime.engine.weight_sync.collective import Rendezvous, SyncGroup, join_group, open_store, receive_pieces
from vime.engine.weight_sync.delta import (
    PATCH_INDICES,
    PATCH_VALUES,
    DeltaTracker,
    Patch,
    ShadowWeights,
    apply_patch,
    changed_elements,
    file_entries,
)


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.int16)


def test_a_patch_reproduces_the_new_bf16_tensor_bit_for_bit():
    old = torch.randn(64, 32).to(torch.bfloat16)
    new = old.clone()
    new[3, :5] += 1.0
    new[7, 7] = -0.0 if old[7, 7] == 0 else -old[7, 7]
    new[10, 1] = torch.nan
    patch = changed_elements(old, new)
    assert patch.indices.dtype == torch.int32 and patch.values.dtype == torch.bfloat16
    assert patch.indices.numel() == int((bits(old) != bits(new)).sum())
    assert patch.nbytes == patch.indices.numel() * (4 + 2)
    base = old.clone()
    apply_patch(base, patch)
    assert torch.equal(bits(base), bits(new))


def test_zero_and_negative_zero_differ_in_bits():
    old, new = torch.zeros(4, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.bfloat16)
    new[2] = -0.0
    assert changed_elements(old, new).indices.tolist() == [2]


def test_the_tracker_sends_dense_until_a_commit_and_again_after_a_reset():
    tracker = DeltaTracker()
    weights = {"a": torch.randn(100).to(torch.bfloat16), "b": torch.randn(10, 10).to(torch.bfloat16)}
    planned, stats = tracker.plan(weights)
    assert not tracker.is_delta(planned) and stats.changed == stats.total == 200
    tracker.commit(weights, version=1)
    weights["a"][:3] += 1  # the trainer steps in place: the record must not follow
    planned, stats = tracker.plan(weights)
    assert tracker.is_delta(planned) and tracker.base_version == 1
    assert isinstance(planned["a"], Patch) and planned["a"].indices.tolist() == [0, 1, 2]
    assert planned["b"].indices.numel() == 0 and (stats.changed, stats.total) == (3, 200)
    tracker.commit(weights, version=2, planned=planned)  # the base is patched, not copied
    assert tracker.base_version == 2 and torch.equal(tracker.base["a"], weights["a"])
    assert tracker.plan(weights)[1].changed == 0  # nothing moved since
    weights["c"] = torch.zeros(2)  # a new tensor: the record no longer matches, all dense
    assert not tracker.is_delta(tracker.plan(weights)[0])
    tracker.reset()
    assert not tracker.is_delta(tracker.plan({"a": weights["a"]})[0]) and tracker.base_version is None


def test_a_tensor_whose_patch_would_outweigh_it_goes_whole():
    """A patch costs 4 index bytes per changed element on top of its value: when most of a tensor
    changed (Adam on a float32 wire moves every element) sending it dense is smaller."""
    tracker = DeltaTracker()
    weights = {"moved": torch.zeros(100), "still": torch.zeros(100)}
    tracker.commit(weights, version=1)
    weights["moved"] += 1e-6
    weights["still"][:5] = 1.0
    planned, stats = tracker.plan(weights)
    assert planned["moved"] is weights["moved"] and isinstance(planned["still"], Patch)
    assert (stats.changed, stats.total) == (105, 200)  # what changed is reported either way


def test_a_patched_tensor_is_two_entries_in_the_weights_file():
    patch = Patch(torch.tensor([1], dtype=torch.int32), torch.tensor([2.0]))
    entries = file_entries({"w": torch.zeros(3), "p": patch})
    assert list(entries) == ["w", "p" + PATCH_INDICES, "p" + PATCH_VALUES]


def test_a_server_worker_refuses_a_delta_against_weights_it_does_not_hold():
    shadow = ShadowWeights()
    with pytest.raises(RuntimeError, match="version 3, but this server holds no kept weights"):
        shadow.expect(3)
    shadow.keep("w", torch.zeros(4))
    shadow.finish("3")
    shadow.expect(3)
    with pytest.raises(RuntimeError, match="holds version 3"):
        shadow.expect(2)
    shadow.start()  # an update began and did not finish: nothing complete is held
    with pytest.raises(RuntimeError, match="no kept weights"):
        shadow.expect(3)
    assert shadow.patched("w", Patch(torch.tensor([2], dtype=torch.int32), torch.tensor([5.0]), 4)).tolist() == [
        0, 0, 5, 0]


def _receiver(info: dict, sizes: list[int], bucket_bytes: int, queue) -> None:
    rz = Rendezvous(info["host"], info["port"], info["world_size"], info["prefix"], info["timeout_s"])
    store = open_store(rz.host, rz.port, is_master=False, world_size=rz.world_size, timeout_s=rz.timeout_s)
    group = join_group(store, rz, info["rank_offset"], torch.device("cpu"))
    queue.put([p.tolist() for p in receive_pieces(group, sizes, bucket_bytes, torch.device("cpu"))])


def test_the_bucketed_broadcast_delivers_every_piece_to_every_rank():
    gen = torch.Generator().manual_seed(0)
    pieces = [torch.randint(0, 256, (n,), generator=gen, dtype=torch.uint8) for n in (10, 0, 2500, 999, 1, 1000)]
    sizes, bucket_bytes = [p.numel() for p in pieces], 1000
    group = SyncGroup(3, advertise_host="127.0.0.1", timeout_s=60)
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(group.init_info(rank), sizes, bucket_bytes, queue))
             for rank in (1, 2)]
    for p in procs:
        p.start()
    try:
        group.join()
        assert group.send(pieces, sum(sizes), bucket_bytes) == 5  # ceil(4510 / 1000)
        expected = [p.tolist() for p in pieces]
        assert queue.get(timeout=60) == expected and queue.get(timeout=60) == expected
    finally:
        for p in procs:
            p.join(timeout=30)
    assert [p.exitcode for p in procs] == [0, 0]
