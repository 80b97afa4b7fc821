"""The collective weight-sync engine: the trainer broadcasts to two vLLM CPU servers over gloo.

Two servers for the module, started with `weight_sync_server_args("collective")`; the trainer
is the tiny model in transformers (fp32, as in tests/test_weight_sync.py). One sync updates
both, checked by `verify_sync` on each; a rendezvous that cannot happen fails before anything
is paused; a delta sync leaves the servers computing exactly what a dense sync of the same
weights does.
"""

from __future__ import annotations

import os
from pathlib import Path

import aiohttp
import pytest
import torch
from safetensors.torch import load_file

import vime
from vime.engine.client import EngineClient
from vime.engine.weight_sync.live_weights import read_version
from vime.engine.server import VLLMServer
from vime.engine.weight_sync.protocol import weight_sync_server_args
from vime.engine.weight_sync.sync import WeightSync
from vime.engine.weight_sync.verify import probe_logprobs, reference_logprobs, server_weight_version, verify_sync
from vime.errors import ServiceError
from tests.test_weight_sync import probe, trainer  # noqa: F401  module fixtures: a trainer of its own here

pytestmark = pytest.mark.vllm

ATOL = 1e-3
REPO_ROOT = Path(vime.__file__).resolve().parents[1]
UNREACHABLE = "192.0.2.1"  # TEST-NET-1 (RFC 5737): no host answers there


@pytest.fixture(scope="module")
def servers(tiny_model_dir, tmp_path_factory):
    """Two servers, started together (each takes ~1 min to start here)."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)
    logs = tmp_path_factory.mktemp("vllm-collective")
    started = [VLLMServer(tiny_model_dir, served_model_name="tiny", log_path=logs / f"vllm{i}.log",
                          server_args=[*weight_sync_server_args("collective"), "--max-model-len", "1024",
                                       "--seed", "0"],
                          env={"PYTHONPATH": pythonpath}) for i in range(2)]
    try:
        for server in started:
            server.start()
        for server in started:
            server.wait_healthy(600)
        yield started
    finally:
        for server in started:
            server.stop()


def perturb(model: torch.nn.Module, seed: int, scale: float = 0.02, fraction: float = 1.0) -> None:
    """Add noise to a `fraction` of every parameter's elements: a stand-in for a train step."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            mask = torch.rand(p.shape, generator=gen) < fraction
            p.add_(torch.randn(p.shape, generator=gen) * scale * mask)


def numel(model: torch.nn.Module) -> int:
    return sum(t.numel() for n, t in model.state_dict().items() if n != "lm_head.weight")


async def rollout(url: str, prompt: list[int]) -> tuple[list[int], list[float]]:
    async with EngineClient(url) as client:
        out = await client.generate(prompt, {"max_tokens": 24, "temperature": 1.0, "seed": 7, "ignore_eos": True})
    return out.token_ids, out.log_probs


async def test_one_collective_sync_updates_both_servers(servers, trainer, probe, tmp_path):
    urls = [s.url for s in servers]
    perturb(trainer, seed=1)
    expected = reference_logprobs(trainer, probe)
    published = []
    async with WeightSync(urls, engine="collective", bucket_bytes=1 << 20, directory=tmp_path) as sync:
        report = await sync.sync(trainer.state_dict())
        # the group is formed once, then reused; the live weights a restarted server boots from
        # are written after the pause, as a full checkpoint
        again = await sync.sync(trainer.state_dict(), then=published.append)
    print(f"\ncollective sync to 2 servers: {report.wire_bytes / 1e6:.1f} MB, pause {report.pause_seconds:.2f} s, "
          f"total {report.total_seconds:.2f} s; second {again.total_seconds:.2f} s")
    assert report.engine == "collective" and not report.delta
    assert report.changed == report.total == numel(trainer)
    assert report.wire_bytes == report.bytes == 4 * numel(trainer)  # fp32, each element once
    for url in urls:
        assert await verify_sync(url, probe, expected) <= ATOL
        assert await server_weight_version(url) == str(again.weight_version)
    (path,) = published
    assert read_version(path) == again.weight_version
    assert set(load_file(str(path))) == {n for n in trainer.state_dict() if n != "lm_head.weight"}


async def test_a_bad_rendezvous_fails_in_one_line_and_the_servers_keep_serving_their_weights(
        servers, trainer, probe):
    urls = [s.url for s in servers]
    before = reference_logprobs(trainer, probe)
    versions = [await server_weight_version(u) for u in urls]
    perturb(trainer, seed=2)
    async with WeightSync(urls, engine="collective", advertise_host=UNREACHABLE, rendezvous_timeout=5) as sync:
        with pytest.raises(ServiceError) as failure:
            await sync.sync(trainer.state_dict())
    message = str(failure.value)
    print(f"\n{message}")
    assert "\n" not in message
    assert f"collective rendezvous at {UNREACHABLE}:" in message and "nothing was paused" in message
    assert "could not join the trainer's weight-sync group" in message
    for url, version in zip(urls, versions):
        async with aiohttp.ClientSession() as http, http.get(url + "/is_paused") as resp:
            assert (await resp.json())["is_paused"] is False
        assert await server_weight_version(url) == version
        assert await verify_sync(url, probe, before) <= ATOL
    async with WeightSync(urls, engine="collective") as sync:  # the servers join a good group next
        await sync.sync(trainer.state_dict())
    for url in urls:
        assert await verify_sync(url, probe, reference_logprobs(trainer, probe)) <= ATOL


async def test_a_delta_sync_leaves_the_servers_computing_what_a_dense_sync_does(servers, trainer, probe):
    """bf16 on the wire, as a bf16 run sends: the delta is computed on the bits vLLM loads."""
    urls = [s.url for s in servers]
    async with WeightSync(urls, engine="collective", update_mode="delta", dtype=torch.bfloat16) as sync:
        first = await sync.sync(trainer.state_dict())
        perturb(trainer, seed=3, fraction=0.01)
        delta = await sync.sync(trainer.state_dict())
        after_delta = [(await probe_logprobs(u, probe), await rollout(u, probe[:12])) for u in urls]
    print(f"\ndense {first.wire_bytes / 1e6:.2f} MB -> delta {delta.wire_bytes / 1e6:.3f} MB, "
          f"{delta.changed}/{delta.total} elements changed, {delta.total_seconds:.2f} s")
    assert not first.delta and first.changed == first.total == numel(trainer)
    assert first.wire_bytes == 2 * numel(trainer)
    assert delta.delta and 0 < delta.changed < 0.02 * delta.total
    assert delta.wire_bytes == 6 * delta.changed  # int32 index + bf16 value per changed element

    async with WeightSync(urls, engine="collective", dtype=torch.bfloat16) as sync:
        dense = await sync.sync(trainer.state_dict())
    assert dense.changed == dense.total
    for url, (probe_after_delta, (tokens, logprobs)) in zip(urls, after_delta):
        assert await probe_logprobs(url, probe) == probe_after_delta
        assert await rollout(url, probe[:12]) == (tokens, logprobs)
