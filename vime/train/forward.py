"""The logits that predict a micro-batch's response tokens, from one model call.

`batching.pack` lays a micro-batch out as one row (samples one after the other, positions
restarting at 0), which is what variable-length attention kernels (flash attention's `varlen`)
want. Under `sdpa` or `eager` attention, though, transformers turns that row into a T x T
block-diagonal mask: attention costs the square of the *whole micro-batch's* length instead of
the sum of each sample's square. On the tiny model, 64 samples of 50 tokens, the model body took
0.24 s as one row and 0.036 s as a batch of 64 rows (a forward, one CPU thread).
And the LM head ran on every prompt position, though only response positions are trained.

So under any attention but flash attention the samples are laid out as a batch of rows when that
is cheaper (`padding_pays`), prompts left-padded to end in the same column and responses
right-padded (as TRL and generation do): every sample's response then sits in the same columns,
and `logits_to_keep` asks the model for the logits of those columns only (a packed row gets the
response positions' logits only, too). The result is the same `[R, vocab]` tensor, in the same order
(sample by sample, position by position), as `logits[0, packed.logit_index]` of the packed row;
`tests/test_forward.py` holds them equal.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from vime.train.batching import PackedBatch

PACKED_ATTENTION = ("flash_attention_2", "flash_attention_3")
"""Attention implementations that take a packed row as separate sequences at no extra cost."""


@functools.lru_cache(maxsize=None)
def _takes_logits_to_keep(model_class: type) -> bool:
    return "logits_to_keep" in inspect.signature(model_class.forward).parameters


def padding_pays(model: torch.nn.Module, packed: PackedBatch) -> bool:
    """Whether padded rows cost fewer operations than the packed row: never under a varlen kernel;
    else per layer, in units of 2 x hidden size, about 6 x hidden x tokens for the linear layers
    plus one per attention entry, T^2 for the row's mask against N x W^2 for N rows of W columns
    (padding counted). Short samples on a wide model stay packed, and so does a micro-batch of one
    long trajectory among short ones; many samples of similar length are padded."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) in PACKED_ATTENTION:
        return False
    hidden = getattr(config, "hidden_size", None) or 4096
    lengths = packed.cu_seqlens.diff().tolist()
    prompt = max(n - r for n, r in zip(lengths, packed.response_lengths))
    n, width, total = len(lengths), prompt + max(packed.response_lengths), sum(lengths)
    return 6 * hidden * n * width + n * width * width <= 6 * hidden * total + total * total


def response_logits(model: torch.nn.Module, packed: PackedBatch) -> torch.Tensor:
    """`[R, vocab]`: row r holds the logits that predict `packed.targets[r]`, from padded rows
    or the packed row, whichever `padding_pays` picks."""
    return padded_logits(model, packed) if padding_pays(model, packed) else packed_logits(model, packed)


def _keeps_logits(model: torch.nn.Module) -> bool:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # peft's wrapper
    return _takes_logits_to_keep(type(base))


def packed_logits(model: torch.nn.Module, packed: PackedBatch) -> torch.Tensor:
    """`response_logits` from the packed row; only the response positions through the LM head
    when the model takes `logits_to_keep`."""
    if _keeps_logits(model):
        return model(**packed.model_inputs(), logits_to_keep=packed.logit_index).logits[0]
    return model(**packed.model_inputs()).logits[0, packed.logit_index]


def padded_logits(model: torch.nn.Module, packed: PackedBatch) -> torch.Tensor:
    """`response_logits` from padded rows (`padded`); only the response columns through the LM
    head when the model takes `logits_to_keep`."""
    rows = padded(packed)
    inputs = {"input_ids": rows.input_ids, "attention_mask": rows.attention_mask, "position_ids": rows.position_ids,
              "use_cache": False}
    if _keeps_logits(model):
        logits = model(**inputs, logits_to_keep=rows.response_columns).logits
    else:
        logits = model(**inputs).logits[:, rows.response_columns]
    return logits[rows.response_mask]


@dataclass
class PaddedRows:
    """A packed micro-batch as `[N, W]` rows: every sample's prompt ends in the same column, its
    response follows; `response_columns` are the columns whose logits predict response tokens,
    `response_mask[i, j]` whether sample i has a j-th response token."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_columns: torch.Tensor
    response_mask: torch.Tensor


def padded(packed: PackedBatch) -> PaddedRows:
    """The rows of `packed` (see `PaddedRows`); padding is token 0, masked out."""
    device = packed.input_ids.device
    lengths = packed.cu_seqlens.diff().to(device=device, dtype=torch.long)
    responses = torch.tensor(packed.response_lengths, dtype=torch.long, device=device)
    prompts = lengths - responses
    n, prompt_width, response_width = len(lengths), int(prompts.max()), int(responses.max())
    width = prompt_width + response_width
    row = torch.repeat_interleave(torch.arange(n, device=device), lengths)
    position = packed.position_ids[0]
    column = (prompt_width - prompts)[row] + position
    input_ids = torch.zeros((n, width), dtype=packed.input_ids.dtype, device=device)
    input_ids[row, column] = packed.input_ids[0]
    attention_mask = torch.zeros((n, width), dtype=torch.long, device=device)
    attention_mask[row, column] = 1
    position_ids = torch.zeros((n, width), dtype=torch.long, device=device)
    position_ids[row, column] = position
    columns = torch.arange(prompt_width - 1, width - 1, device=device)
    mask = torch.arange(response_width, device=device)[None, :] < responses[:, None]
    return PaddedRows(input_ids, attention_mask, position_ids, columns, mask)
