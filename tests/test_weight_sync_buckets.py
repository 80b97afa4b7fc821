"""`--update-weight-buffer-size`: the collective weight sync broadcasts the weights in buckets of
that many bytes (memory on both sides is one bucket), and tells the servers the same size.

Fast: a one-rank gloo group, no vLLM server (tests/test_weight_sync_collective.py runs the real
broadcast into two servers)."""

from __future__ import annotations

import math

import pytest
import torch

from activities.train import weight_sync_for
from vime.config.args import parse_args
from vime.engine.weight_sync import delta as weight_delta
from vime.engine.weight_sync.collective import SyncGroup
from vime.engine.weight_sync.staging import StagedWeights


@pytest.fixture
def group():
    sync_group = SyncGroup(1, advertise_host="127.0.0.1", timeout_s=30)
    sync_group.join()
    yield sync_group
    sync_group.close()


def test_update_weight_buffer_size_is_the_bucket_the_collective_sync_broadcasts_in(group):
    weights = {"embed.weight": torch.randn(64, 16), "norm.weight": torch.randn(16)}  # 4,160 bytes in fp32
    total = sum(t.numel() * t.element_size() for t in weights.values())

    def buckets(*flags: str) -> tuple[int, int]:
        args = parse_args(["--weight-sync-engine", "collective", *flags])
        sync = weight_sync_for(args, ["http://127.0.0.1:1"])
        staged = StagedWeights(path=None, num_tensors=len(weights), bytes=total, weight_version=1, write_seconds=0.0,
                               started=0.0, tensors=weights, planned=dict(weights), changed=0, total=0)
        sent = group.send(weight_delta.iter_payload(staged.planned), total, sync.bucket_bytes)
        return sent, sync._update_info(staged)["bucket_bytes"]  # what each server receives by

    assert buckets() == (1, 64 << 20)  # the default, 64 MiB: these weights fit in one
    assert buckets("--update-weight-buffer-size", "1000") == (math.ceil(total / 1000), 1000)
