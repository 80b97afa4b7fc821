"""Adapter-only weight sync: a LoRA run's trainer pushes its adapter, not the model, into a
LoRA-enabled vLLM CPU server, which then computes the trainer's logprobs (fp32, 1e-5)."""

from __future__ import annotations

import pytest
import pytest_asyncio
import torch

from tests.test_trainer import make_args, synthetic_batch
from vime.engine.client import EngineClient
from vime.engine.weight_sync.adapter import AdapterSync, adapter_name
from vime.engine.weight_sync.sync import WeightSync
from vime.engine.weight_sync.verify import probe_logprobs, reference_logprobs, verify_sync
from vime.errors import ServiceError
from vime.train.lora import adapter_config
from vime.train.trainer import Trainer

pytestmark = pytest.mark.vllm
ATOL = 1e-5


@pytest_asyncio.fixture
async def setup(lora_server, tiny_model_dir, tmp_path):
    args = make_args(tmp_path, tiny_model_dir, ["--lora-rank", "8", "--loss-type", "sft_loss",
                                                "--global-batch-size", "16", "--lr", "1e-2"])
    async with AdapterSync(lora_server.url, "run1", tmp_path / "adapters") as sync:
        yield Trainer(args), sync


async def test_after_each_adapter_sync_the_server_computes_the_trainers_logprobs(lora_server, setup):
    trainer, sync = setup
    batch = synthetic_batch(0)
    probe = batch[0].tokens + batch[7].tokens
    config = adapter_config(trainer.lora, trainer.model_path)
    full_bytes = sum(t.numel() * t.element_size() for t in trainer.full_state_dict().values())
    base_lp = await probe_logprobs(lora_server.url, probe)
    for version in (1, 2):
        trainer.train_step(batch)
        report = await sync.sync(trainer.adapter_state_dict(), config, version)
        assert report.name == adapter_name("run1", version) == f"run1-v{version}"
        assert report.bytes < full_bytes / 10, (report.bytes, full_bytes)
        print(f"adapter sync v{version}: {report.bytes} bytes (full weights {full_bytes}) in {report.seconds:.3f} s")
        expected = reference_logprobs(trainer.model, probe)
        worst = await verify_sync(lora_server.url, probe, expected, atol=ATOL, model=report.name)
        assert max(abs(a - b) for a, b in zip(expected, base_lp)) > 100 * ATOL  # the adapter changed them
        print(f"verify_sync v{version}: max |vllm - trainer| = {worst:.2e}")

    # a rollout of the run's version samples with the adapter: its logprobs are the trainer's
    async with EngineClient(lora_server.url, model="run1-v2") as client:
        out = await client.generate(probe[:8], {"max_tokens": 6, "temperature": 1.0, "seed": 3})
    ids = probe[:8] + out.token_ids
    expected = reference_logprobs(trainer.model, ids)[7:]
    assert max(abs(a - b) for a, b in zip(out.log_probs, expected)) < ATOL

    # the old version is gone: asking for it fails instead of sampling another policy
    with pytest.raises(ServiceError, match="404|does not exist|not found"):
        await probe_logprobs(lora_server.url, probe, model="run1-v1")
    assert not (sync.directory / "run1-v1").exists() and (sync.directory / "run1-v2").exists()
    # the base model is still served, unchanged
    assert (torch.tensor(await probe_logprobs(lora_server.url, probe)) - torch.tensor(base_lp)).abs().max() < ATOL

    # the full-weight sync of the merged weights (what a LoRA run without adapter sync pushes) is
    # exact too, on the base model's name, into the same LoRA-enabled server
    async with WeightSync(lora_server.url) as full:
        full_report = await full.sync(trainer.full_state_dict(), 3)
    worst = await verify_sync(lora_server.url, probe, reference_logprobs(trainer.model, probe), atol=ATOL)
    print(f"full sync of merged weights: {full_report.wire_bytes} bytes on the wire, max |vllm - trainer| = "
          f"{worst:.2e}; adapter sync: {report.bytes} bytes")
    assert report.bytes < full_report.wire_bytes / 10
