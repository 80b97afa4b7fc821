"""The student's reverse KL to the teacher on held-out prompts, computed exactly with transformers.

For each held-out prompt the student samples `samples` answers (its own distribution: reverse KL
is measured where the student goes), then both models read prompt + answer and at every answer
position we take the full-vocabulary KL(student || teacher) = sum_v p_s(v) (log p_s(v) - log p_t(v)).
The figure is the mean over those positions (the end-of-turn token included, nothing after it):
exact per position, sampled only over the student's paths, so it moves little between
checkpoints for reasons other than training. The same seed at every checkpoint gives every
checkpoint the same random numbers.

Also reported: the share of the answers' tokens that hold a capital letter, the behaviour the
teacher was trained to (`examples.on_policy_distillation.teacher`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

HELDOUT_PROMPTS = ("Name a mountain.", "Describe a forest.", "Write a short poem.", "Give me a word.",
                   "Name an animal.", "Describe the night sky.", "Tell me a story.", "Write a greeting.")
"""Prompts neither the teacher's SFT nor the student's training saw."""


@dataclass(frozen=True)
class HeldoutKL:
    reverse_kl: float  # mean per-token KL(student || teacher) over the answers' positions
    capital_share: float  # share of answer tokens (end of turn excluded) holding a capital letter
    tokens: int


def load(model_dir: str | Path) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()


@torch.no_grad()
def measure(student: Any, teacher: Any, tokenizer: Any, *, prompts=HELDOUT_PROMPTS, samples: int = 8,
            max_tokens: int = 16, seed: int = 0) -> HeldoutKL:
    from vime.rollout.tokenization import encode, render_prompt

    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    capital = _capital_table(tokenizer)
    gen = torch.Generator().manual_seed(seed)
    kl_sum, count, caps, words = 0.0, 0, 0, 0
    for text in prompts:
        prompt = encode(tokenizer, render_prompt(tokenizer, [{"role": "user", "content": text}]))
        ids = torch.tensor([prompt] * samples)
        alive = torch.ones(samples, dtype=torch.bool)
        mask = []
        out = student(input_ids=ids, use_cache=True, logits_to_keep=1)
        for _ in range(max_tokens):
            probs = torch.softmax(out.logits[:, -1].float(), dim=-1)
            token = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
            mask.append(alive.clone())
            ids = torch.cat([ids, token[:, None]], dim=1)
            alive &= token != end
            out = student(input_ids=token[:, None], past_key_values=out.past_key_values, use_cache=True)
        answer_mask = torch.stack(mask, dim=1)  # [samples, max_tokens]: the end token counts, after it nothing
        positions = slice(len(prompt) - 1, ids.shape[1] - 1)  # logits that predict the answer tokens
        log_s = torch.log_softmax(student(input_ids=ids).logits[:, positions].float(), dim=-1)
        log_t = torch.log_softmax(teacher(input_ids=ids).logits[:, positions].float(), dim=-1)
        kl = (log_s.exp() * (log_s - log_t)).sum(-1)
        kl_sum += float((kl * answer_mask).sum())
        count += int(answer_mask.sum())
        answer = ids[:, len(prompt):]
        counted = answer_mask & (answer != end)
        caps += int((capital[answer] & counted).sum())
        words += int(counted.sum())
    return HeldoutKL(kl_sum / max(count, 1), caps / max(words, 1), count)


def _capital_table(tokenizer: Any) -> torch.Tensor:
    return torch.tensor([any(c.isupper() for c in tokenizer.decode([i])) for i in range(len(tokenizer))])
