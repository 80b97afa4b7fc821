"""A rollout heals a server that lost its run's LoRA adapter (vime/engine/lora_heal.py), on the
shared LoRA-enabled vLLM CPU server: the adapter is loaded again from the run's directory, under
the name (the version) the request asked for, once for any number of concurrent requests; a
directory that is gone is a clear error, not a retry loop."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from structlog.testing import capture_logs

from tests.conftest import engine_flags
from tests.test_trainer import make_args
from vime.engine.client import EngineClient, EngineRequestError
from vime.engine.lora_heal import AdapterGone, is_missing_model
from vime.engine.weight_sync.adapter import AdapterSync, write_adapter
from vime.engine.weight_sync.lora_serving import adapter_name, adapters_dir
from vime.rollout.data_source import make_data_source
from vime.rollout.generate import generate, serving_adapter
from vime.rollout.group import run_group
from vime.types import Sample

pytestmark = pytest.mark.vllm
PROMPT = [3, 17, 29, 41, 5, 61, 7, 88]
PARAMS = {"max_tokens": 8, "temperature": 1.0, "seed": 7}


def random_adapter(tiny_model_dir, seed: int):
    """A rank-8 all-linear adapter of the tiny model with random A and B (a fresh one is zero:
    the base), in peft's file keys, and its config."""
    import torch
    from transformers import AutoModelForCausalLM

    from vime.train.lora import LoraConfig, adapter_config, adapter_weights, wrap

    config = LoraConfig(rank=8)
    model = wrap(AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32), config)
    gen = torch.Generator().manual_seed(seed)
    adapter = {k: torch.randn(v.shape, generator=gen) * 0.05 for k, v in adapter_weights(model.state_dict()).items()}
    return adapter, adapter_config(config, tiny_model_dir)


@pytest.fixture
def lora_args(lora_server, tiny_model_dir, tmp_path):
    return make_args(tmp_path, tiny_model_dir, ["--lora-rank", "8", "--run-id", "heal", *engine_flags(lora_server)])


async def sample_under(args, run: str, version: int) -> Sample:
    with serving_adapter(args, run, version):
        return await generate(args, Sample(index=0, tokens=list(PROMPT)), dict(PARAMS))


async def unload(url: str, name: str) -> None:
    """What a restarted server (or one of a shared fleet) looks like: it no longer holds `name`."""
    async with aiohttp.ClientSession() as http, http.post(f"{url}/v1/unload_lora_adapter",
                                                          json={"lora_name": name}) as resp:
        assert resp.status == 200, await resp.text()


def sampled(sample: Sample) -> bool:
    return sample.status in (Sample.Status.COMPLETED, Sample.Status.TRUNCATED) and bool(sample.rollout_log_probs)


def reloaded(logs) -> list[dict]:
    return [e for e in logs if e["event"] == "lora.adapter_reloaded"]


async def test_a_server_that_lost_the_adapter_gets_it_back_and_samples_the_same_policy(lora_server, lora_args,
                                                                                       tiny_model_dir):
    adapter, config = random_adapter(tiny_model_dir, 1)
    async with AdapterSync(lora_server.url, "heal", adapters_dir(lora_args.run_dir, "heal")) as sync:
        await sync.sync(adapter, config, 1)
    before = await sample_under(lora_args, "heal", 1)
    base = await generate(lora_args, Sample(index=0, tokens=list(PROMPT)), dict(PARAMS))
    assert before.weight_versions[0]["adapter"] == "heal-v1"
    await unload(lora_server.url, "heal-v1")

    # the server answers vLLM's 404 "The model `heal-v1` does not exist." (what the rollout heals)
    async with EngineClient(lora_server.url, model="heal-v1") as client:
        with pytest.raises(EngineRequestError) as refused:
            await client.generate(PROMPT, dict(PARAMS))
    assert is_missing_model(refused.value) and "`heal-v1` does not exist" in refused.value.body, refused.value.body

    with capture_logs() as logs:
        after = await sample_under(lora_args, "heal", 1)
    assert after.tokens == before.tokens and after.weight_versions == before.weight_versions
    worst = max(abs(a - b) for a, b in zip(after.rollout_log_probs, before.rollout_log_probs))
    moved = max(abs(a - b) for a, b in zip(before.rollout_log_probs, base.rollout_log_probs))
    print(f"healed heal-v1: max |after - before| = {worst:.2e} (the adapter moves logprobs by up to {moved:.2f})")
    assert worst < 1e-5
    [line] = reloaded(logs)
    assert line["adapter"] == "heal-v1" and line["server"] == lora_server.url
    assert line["log_level"] == "warning" and line["loaded_on"] == [lora_server.url]
    await unload(lora_server.url, "heal-v1")


async def test_concurrent_requests_for_a_missing_adapter_load_it_once(lora_server, lora_args, tiny_model_dir):
    name = adapter_name("heal", 2)
    adapter, config = random_adapter(tiny_model_dir, 2)
    write_adapter(adapter, config, adapters_dir(lora_args.run_dir, "heal") / name)  # on disk, on no server
    with capture_logs() as logs:
        samples = await asyncio.gather(*(sample_under(lora_args, "heal", 2) for _ in range(8)))
    assert len(samples) == 8 and all(map(sampled, samples))
    assert all(s.weight_versions[0]["adapter"] == name for s in samples)
    assert len({tuple(s.rollout_log_probs) for s in samples}) == 1  # one seed, one policy
    assert len(reloaded(logs)) == 1, reloaded(logs)
    await unload(lora_server.url, name)


async def test_an_adapter_whose_directory_is_gone_is_a_clear_error(lora_server, lora_args):
    with pytest.raises(AdapterGone, match=r"'heal-v3'.*" + str(adapters_dir(lora_args.run_dir, "heal") / "heal-v3")):
        await sample_under(lora_args, "heal", 3)


async def test_a_rollout_group_survives_a_server_that_lost_its_adapter(lora_server, lora_args, tiny_model_dir):
    name = adapter_name("heal", 4)
    adapter, config = random_adapter(tiny_model_dir, 4)
    write_adapter(adapter, config, adapters_dir(lora_args.run_dir, "heal") / name)
    with capture_logs() as logs, serving_adapter(lora_args, "heal", 4):
        results = await run_group(lora_args, make_data_source(lora_args).prompt_group(0))
    samples = [s for r in results for s in r]
    assert len(samples) == 4 and all(map(sampled, samples))
    assert all(s.weight_versions and s.weight_versions[0]["version"] == "4" for s in samples)
    assert len(reloaded(logs)) == 1
    await unload(lora_server.url, name)

    # with its directory gone too the group's samples fail once (the request's error, not the
    # infrastructure's: nothing generates the group again under a policy it did not ask for)
    with serving_adapter(lora_args, "heal", 5):
        results = await run_group(lora_args, make_data_source(lora_args).prompt_group(0))
    samples = [s for r in results for s in r]
    assert all(s.status == Sample.Status.FAILED and "AdapterGone" in s.metadata["error"] for s in samples)
    assert not any("infra_failure" in s.metadata for s in samples)
