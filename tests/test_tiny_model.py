"""The tiny test model: a Qwen2 chat model with random weights that vime builds offline.

Every vLLM, trainer and agent test runs on it, so it must load in transformers, keep its chat
markup as single tokens, render tool calls and reasoning the way Qwen does, and come out the
same from the same seed.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import unicodedata
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from tokenizers import Tokenizer
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from vime.errors import ConfigError
from vime.testing import tiny_model
from vime.testing.tiny_model import (
    MARKUP_TOKENS,
    MODEL_FILES,
    SPECIAL_TOKENS,
    build_tiny_model,
    cache_key,
    tiny_model_dir,
)

GENERATION_PROMPT = "<|im_start|>assistant\n"

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Weather in Paris and Lyon?"},
    {
        "role": "assistant",
        "content": "",
        "reasoning_content": "I need the tool twice.",
        "tool_calls": [
            {"id": "c1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"id": "c2", "type": "function",
             "function": {"name": "get_weather", "arguments": '{"city": "Lyon"}'}},
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    {"role": "assistant", "content": "Sunny in Paris, rain in Lyon.", "reasoning_content": "Both known."},
    {"role": "user", "content": "Thanks."},
]


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return tiny_model_dir()


@pytest.fixture(scope="module")
def tokenizer(model_dir):
    return AutoTokenizer.from_pretrained(model_dir)


def render(tokenizer, messages, **kwargs) -> str:
    return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)


def tensor_hashes(path: Path) -> dict[str, str]:
    with safe_open(path, framework="pt") as f:
        return {k: hashlib.sha256(f.get_tensor(k).numpy().tobytes()).hexdigest() for k in f.keys()}


# --- loading ---------------------------------------------------------------------------


def test_directory_holds_a_complete_hf_checkpoint(model_dir):
    for name in MODEL_FILES:
        assert (model_dir / name).is_file(), name
    tokenizer_config = json.loads((model_dir / "tokenizer_config.json").read_text())
    assert tokenizer_config["chat_template"] == tiny_model.CHAT_TEMPLATE


def test_config_is_a_small_qwen2_shaped_for_vllm_cpu(model_dir, tokenizer):
    config = AutoConfig.from_pretrained(model_dir)
    assert config.model_type == "qwen2"
    assert config.hidden_size // config.num_attention_heads == 64  # vLLM CPU rejects head_dim 16
    assert config.num_hidden_layers == 2
    assert config.max_position_embeddings == 65536
    assert config.tie_word_embeddings
    assert config.vocab_size == len(tokenizer) == 8192  # one embedding row per token, no more
    assert config.eos_token_id == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert config.bos_token_id is None


def test_transformers_runs_a_forward_pass(model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.dtype == torch.float32
    ids = tokenizer("def add(a, b):\n    return a + b\n", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


# --- tokenizer -------------------------------------------------------------------------


@pytest.mark.parametrize("token", SPECIAL_TOKENS + MARKUP_TOKENS)
def test_chat_markup_tokens_are_single_ids(tokenizer, token):
    ids = tokenizer.encode(f"x{token}y", add_special_tokens=False)
    assert tokenizer.convert_tokens_to_ids(token) in ids
    assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)]


def test_eos_and_pad(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>"
    assert tokenizer.pad_token == "<|endoftext|>"


def test_skipping_special_tokens_keeps_tool_and_think_tags(tokenizer):
    """vLLM decodes with skip_special_tokens=True; its tool and reasoning parsers need the tags."""
    text = '<think>\nhm\n</think>\n\n<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids, skip_special_tokens=True) == text.removesuffix("<|im_end|>")


def test_tokenizer_file_and_transformers_agree(model_dir, tokenizer):
    """transformers 5 rebuilds a qwen2 tokenizer's pipeline from its own code; the ids must
    still be those of tokenizer.json, which other loaders use as it stands."""
    raw = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = "Ünïcödé 123456789\t\t  x  \n\n\n  🎉 中文 don't <tool_call>{\"a\": [1, 2]}</tool_call>"
    assert raw.encode(text).ids == tokenizer.encode(text, add_special_tokens=False)


def test_decode_inverts_encode(tokenizer):
    text = unicodedata.normalize("NFC", "  indented\n\ttabs\r\n émoji 🎉 and 中文 \x00 bytes ")
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_code_compresses_like_a_real_tokenizer(tokenizer):
    """Agent clients send 40-50k characters; at ~3 characters a token that fits a CPU context."""
    source = Path(tiny_model.__file__).read_text()
    assert len(source) / len(tokenizer.encode(source, add_special_tokens=False)) > 2.5


# --- chat template ---------------------------------------------------------------------


def test_conversation_with_tools_and_reasoning_renders_qwen_style(tokenizer):
    text = render(tokenizer, CONVERSATION, tools=[WEATHER_TOOL], add_generation_prompt=True)

    assert text.startswith("<|im_start|>system\nYou are terse.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools>" in text
    assert "<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>" in text
    assert (
        "<|im_start|>assistant\n<think>\nI need the tool twice.\n</think>\n\n"
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Lyon"}}\n</tool_call><|im_end|>\n'
    ) in text
    assert (
        "<|im_start|>user\n<tool_response>\nsunny\n</tool_response>\n"
        "<tool_response>\nrain\n</tool_response><|im_end|>\n"
    ) in text
    assert (
        "<|im_start|>assistant\n<think>\nBoth known.\n</think>\n\n"
        "Sunny in Paris, rain in Lyon.<|im_end|>\n"
    ) in text
    assert text.endswith("<|im_start|>user\nThanks.<|im_end|>\n" + GENERATION_PROMPT)


def test_tokenized_rendering_matches_the_text(tokenizer):
    text = render(tokenizer, CONVERSATION, tools=[WEATHER_TOOL], add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(CONVERSATION, tools=[WEATHER_TOOL], tokenize=True,
                                        add_generation_prompt=True, return_dict=False)
    assert ids == tokenizer.encode(text, add_special_tokens=False)
    generation_prompt = tokenizer.encode(GENERATION_PROMPT, add_special_tokens=False)
    assert ids[-len(generation_prompt):] == generation_prompt


def test_plain_chat_has_no_default_system_prompt(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n" + GENERATION_PROMPT


def test_tools_without_a_system_message_open_a_system_turn(tokenizer):
    text = render(tokenizer, [{"role": "user", "content": "hi"}], tools=[WEATHER_TOOL])
    assert text.startswith("<|im_start|>system\n# Tools\n")
    assert text.endswith("</tool_call><|im_end|>\n<|im_start|>user\nhi<|im_end|>\n")


def test_content_parts_render_as_their_text(tokenizer):
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert render(tokenizer, [{"role": "user", "content": parts}]) == "<|im_start|>user\nab<|im_end|>\n"


@pytest.mark.parametrize("turn", CONVERSATION[2:6:3], ids=["tool_calls", "answer"])
def test_a_reply_extends_the_generation_prompt(tokenizer, turn):
    """What the model sampled after the generation prompt is what the next request renders."""
    history = CONVERSATION[:2]
    prompt = render(tokenizer, history, tools=[WEATHER_TOOL], add_generation_prompt=True)
    full = render(tokenizer, history + [turn], tools=[WEATHER_TOOL])
    assert full.startswith(prompt)
    assert full.endswith("<|im_end|>\n")


# --- determinism and cache -------------------------------------------------------------


def test_a_fresh_cache_rebuilds_the_same_files(model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("VIME_CACHE", str(tmp_path))
    again = tiny_model_dir()
    assert again.parent == tmp_path and again.name == model_dir.name
    for name in MODEL_FILES:
        assert (again / name).read_bytes() == (model_dir / name).read_bytes(), name
        assert (again / name).stat().st_mode & 0o777 == 0o644, name


def test_another_seed_changes_every_weight_but_not_the_tokenizer(model_dir, tmp_path):
    other = build_tiny_model(tmp_path, seed=1)
    assert (other / "tokenizer.json").read_bytes() == (model_dir / "tokenizer.json").read_bytes()
    seed0, seed1 = tensor_hashes(model_dir / "model.safetensors"), tensor_hashes(other / "model.safetensors")
    assert seed0.keys() == seed1.keys()
    assert all(seed0[k] != seed1[k] for k in seed0)  # biases and norms are random too


def fake_build(calls: list):
    """Stands in for the real build where only the cache's bookkeeping is under test."""

    def build(out_dir, *, seed=0, vocab_size=8192):
        calls.append(seed)
        time.sleep(0.2)
        for name in MODEL_FILES:
            (out_dir / name).write_text(str(seed))
        return out_dir

    return build


def test_cache_builds_once_then_returns_the_same_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("VIME_CACHE", str(tmp_path))
    calls: list = []
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build(calls))
    first = tiny_model_dir()
    assert first == tmp_path / f"tiny-model-{cache_key()}"

    t0 = time.monotonic()
    assert tiny_model_dir() == first
    assert time.monotonic() - t0 < 0.1
    assert calls == [0]
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == [first.name]


def test_concurrent_callers_share_one_build(tmp_path, monkeypatch):
    monkeypatch.setenv("VIME_CACHE", str(tmp_path))
    calls: list = []
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build(calls))
    results: list = []
    threads = [threading.Thread(target=lambda: results.append(tiny_model_dir(seed=5))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert calls == [5]
    assert len(set(results)) == 1 and len(results) == 4
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]  # the temp build dir is gone


def test_an_incomplete_cache_entry_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("VIME_CACHE", str(tmp_path))
    calls: list = []
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build(calls))
    broken = tmp_path / f"tiny-model-{cache_key(seed=3)}"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    assert tiny_model_dir(seed=3) == broken
    assert calls == [3] and (broken / "model.safetensors").read_text() == "3"


def test_cache_key_follows_the_build_parameters(monkeypatch):
    assert cache_key(seed=0) == cache_key(seed=0)
    assert cache_key(seed=0) != cache_key(seed=1)
    assert cache_key(vocab_size=8192) != cache_key(vocab_size=4096)
    before = cache_key()
    monkeypatch.setattr(tiny_model, "BUILD_VERSION", tiny_model.BUILD_VERSION + 1)
    assert cache_key() != before


def test_module_entry_point_prints_the_directory(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("VIME_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny_model, "build_tiny_model", fake_build([]))
    assert tiny_model.main(["--seed", "2"]) == 0
    assert capsys.readouterr().out == f"{tmp_path / f'tiny-model-{cache_key(seed=2)}'}\n"


# --- errors ----------------------------------------------------------------------------


def test_a_too_small_vocabulary_is_refused_with_the_value(tmp_path):
    with pytest.raises(ConfigError, match=r"vocab_size 100 .* >= 512"):
        build_tiny_model(tmp_path, vocab_size=100)


def test_a_non_integer_seed_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"seed '1' is not an int"):
        build_tiny_model(tmp_path, seed="1")


def test_an_output_path_that_is_a_file_is_refused(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        build_tiny_model(tmp_path / "f")
