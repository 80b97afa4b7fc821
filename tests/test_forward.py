"""A micro-batch's response logits come from one model call on padded rows (under sdpa and
eager attention) and equal, value for value and gradient for gradient, those of the packed row
they replace: the same tokens trained, the same update."""

from __future__ import annotations

import pytest
import torch

from tests.test_batching import random_samples
from vime.train.batching import pack
from vime.train.forward import packed_logits, padded, padded_logits, padding_pays, response_logits
from vime.train.losses import token_logprobs

# prompt and response lengths that differ within the micro-batch (a group shares its prompt; a
# step mixes groups), one response of a single token
SHAPES = [(9, 3), (14, 5), (4, 1), (12, 11), (7, 3)]
GROUP_LIKE = [(44 + i % 5, 30) for i in range(16)]  # (length, prompt) of a step's samples: similar lengths


def qwen2(impl: str, seed: int = 0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    config = Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
                         num_key_value_heads=1, vocab_size=256, max_position_embeddings=256,
                         tie_word_embeddings=True)
    return Qwen2ForCausalLM._from_config(config, attn_implementation=impl)


def packed_row_logits(model, p):
    return model(**p.model_inputs()).logits[0, p.logit_index]


def one_by_one(model, samples):
    return torch.cat([model(input_ids=torch.tensor([s.tokens])).logits[0, s.prompt_length - 1: -1] for s in samples])


def test_the_padded_layout_puts_every_response_in_the_same_columns():
    samples = random_samples([(5, 2), (4, 3)])
    rows = padded(pack(samples))
    # prompts of 2 and 3 tokens end in column 2; responses of 3 and 1 tokens follow
    assert rows.attention_mask.tolist() == [[0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]]
    assert rows.position_ids.tolist() == [[0, 0, 1, 2, 3, 4], [0, 1, 2, 3, 0, 0]]
    assert rows.input_ids[0, 1:].tolist() == samples[0].tokens and rows.input_ids[1, :4].tolist() == samples[1].tokens
    assert rows.response_columns.tolist() == [2, 3, 4]
    assert rows.response_mask.tolist() == [[True, True, True], [True, False, False]]


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_padded_rows_give_the_packed_rows_logits(impl):
    model = qwen2(impl).eval()
    samples = random_samples(SHAPES, seed=3)
    p = pack(samples)
    with torch.no_grad():
        logits = padded_logits(model, p)
        assert logits.shape == (sum(s.response_length for s in samples), 256)
        assert torch.allclose(logits, packed_row_logits(model, p), atol=1e-5)
        assert torch.allclose(logits, one_by_one(model, samples), atol=1e-5)
        assert torch.allclose(packed_logits(model, p), logits, atol=1e-5)  # the LM head on response rows only


def test_the_loss_gradients_are_those_of_the_packed_row():
    samples = random_samples(SHAPES, seed=4)
    p = pack(samples)
    grads = []
    for forward in (padded_logits, packed_row_logits):
        model = qwen2("sdpa").train()
        token_logprobs(forward(model, p), p.targets).mean().backward()
        assert all(torch.isfinite(q.grad).all() for q in model.parameters())
        grads.append({n: q.grad for n, q in model.named_parameters()})
    assert max(float((grads[0][n] - grads[1][n]).abs().max()) for n in grads[0]) < 1e-6


def test_a_lora_model_is_called_through_its_wrapper():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(qwen2("sdpa"), LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    samples = random_samples(SHAPES, seed=5)
    p = pack(samples)
    with torch.no_grad():
        assert torch.allclose(padded_logits(model, p), packed_row_logits(model, p), atol=1e-5)


def test_flash_attention_keeps_the_packed_row(monkeypatch):
    """Varlen kernels take a packed row at no extra cost: it is passed as it is, even where sdpa
    would pad."""
    model = qwen2("sdpa").eval()
    p = pack(random_samples(GROUP_LIKE, seed=7))
    assert padding_pays(model, p)
    seen = {}

    def spy(**kwargs):
        seen.update(kwargs)
        return type("Out", (), {"logits": torch.zeros(1, len(p.logit_index), 256)})()

    monkeypatch.setattr(model.config, "_attn_implementation", "flash_attention_2")
    monkeypatch.setattr(model, "forward", spy)
    assert response_logits(model, p).shape == (len(p.logit_index), 256)
    assert "attention_mask" not in seen and seen["input_ids"].shape == p.input_ids.shape
    assert torch.equal(seen["logits_to_keep"], p.logit_index)


def test_many_samples_of_similar_length_are_padded_and_a_long_one_among_short_ones_stays_packed():
    model = qwen2("sdpa").eval()
    group_like = pack(random_samples(GROUP_LIKE, seed=6))  # a step's samples
    skewed = pack(random_samples([(120, 10), (8, 3), (9, 4), (7, 2)], seed=6))  # padding would triple it
    tiny = pack(random_samples(SHAPES, seed=6))  # a few short samples: the linear layers dominate
    assert [padding_pays(model, p) for p in (group_like, skewed, tiny)] == [True, False, False]
    with torch.no_grad():
        for p in (group_like, skewed):
            assert torch.allclose(response_logits(model, p), packed_row_logits(model, p), atol=1e-5)


class WithoutLogitsToKeep(torch.nn.Module):
    """A causal LM whose forward has no `logits_to_keep` (older or custom model code)."""

    def __init__(self, model):
        super().__init__()
        self.inner, self.config = model, model.config

    def forward(self, input_ids, attention_mask=None, position_ids=None, use_cache=False):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          use_cache=use_cache)


def test_a_model_without_logits_to_keep_gets_its_response_logits_cut_from_all_of_them():
    model = qwen2("sdpa").eval()
    bare = WithoutLogitsToKeep(model)
    p = pack(random_samples(GROUP_LIKE, seed=8))
    with torch.no_grad():
        expected = packed_row_logits(model, p)
        assert torch.allclose(padded_logits(bare, p), expected, atol=1e-5)
        assert torch.allclose(packed_logits(bare, p), expected, atol=1e-5)
