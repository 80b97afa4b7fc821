"""Rollout-aware batching: steps of whole rollouts, loss weights, packed micro-batches, DP shards.

A training step holds `--global-batch-size` rollouts. A rollout is one `generate()` call: one
sample, or the siblings of a fan-out sharing `rollout_id`. Invariants kept here:
- siblings never straddle two steps;
- each rollout with at least one masked token contributes one token-weighted mean, and the step
  loss is the mean of those over the step's rollouts. `loss_weights` bakes that into a per-token
  weight, so `sum(weight * token_loss * loss_mask)` summed over any split of the step into
  micro-batches and data-parallel ranks is the step loss (the counts are global to the step);
- samples are never split: micro-batches pack whole samples, ranks receive whole samples.

Packing puts several samples in one row with `position_ids` restarting at 0 per sample and no
attention mask. transformers 5.x then builds a block-diagonal causal mask from the position ids,
but only when no KV cache is in play: call the model with `use_cache=False`
(`PackedBatch.model_inputs()` does), or the samples attend to each other silently. Under sdpa
that mask is T x T for the whole row; `vime.train.forward` lays a micro-batch out as padded rows
instead when they cost less.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from vime.errors import ConfigError
from vime.train.advantages import is_infra_failure
from vime.types import Sample

Rollout = list[Sample]
T = TypeVar("T")


@dataclass
class TrainSample:
    """A sample with what the step computed for it: per-token advantages and loss weights."""

    sample: Sample
    advantages: torch.Tensor
    weights: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return len(self.sample.tokens)


Item = Sample | TrainSample


def num_tokens(item: Item | Sequence[Item]) -> int:
    """Tokens (prompt + response) of a sample, a TrainSample or a micro-batch of them."""
    if isinstance(item, TrainSample):
        return item.num_tokens
    if isinstance(item, Sample):
        return len(item.tokens)
    return sum(num_tokens(x) for x in item)


# ---- steps -----------------------------------------------------------------------------------


def group_rollouts(samples: Sequence[Sample]) -> list[Rollout]:
    """Group samples by `rollout_id` in first-appearance order; `rollout_id=None` is its own rollout."""
    by_id: dict[Hashable, Rollout] = {}
    out: list[Rollout] = []
    for s in samples:
        if s.rollout_id is None:
            out.append([s])
        elif s.rollout_id in by_id:
            by_id[s.rollout_id].append(s)
        else:
            by_id[s.rollout_id] = [s]
            out.append(by_id[s.rollout_id])
    return out


def split_into_steps(
    rollouts: Sequence[Rollout] | Sequence[Sample], global_batch_size: int
) -> tuple[list[list[Rollout]], list[Rollout]]:
    """Cut rollouts into steps of exactly `global_batch_size` rollouts each.

    Accepts rollouts (lists of siblings) or a flat list of samples, grouped by `rollout_id`.
    Returns `(steps, remainder)`: the remainder (fewer than `global_batch_size` rollouts) is for
    the next call, never a short step. Siblings always stay together.
    """
    if global_batch_size < 1:
        raise ConfigError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    items = list(rollouts)
    grouped = group_rollouts(items) if items and isinstance(items[0], Sample) else [list(r) for r in items]
    for r in grouped:
        if not r or len({s.rollout_id for s in r}) != 1:
            raise ConfigError(f"split_into_steps: a rollout must be a non-empty list of siblings, got ids "
                              f"{[s.rollout_id for s in r]}")
    full = len(grouped) - len(grouped) % global_batch_size
    steps = [grouped[i : i + global_batch_size] for i in range(0, full, global_batch_size)]
    return steps, grouped[full:]


# ---- loss weights ----------------------------------------------------------------------------


def _mask(sample: Sample) -> torch.Tensor:
    if sample.loss_mask is None:
        return torch.ones(sample.response_length, dtype=torch.float32)
    return torch.tensor(sample.loss_mask, dtype=torch.float32)


def loss_weights(rollout_masks: Sequence[Sequence[torch.Tensor]]) -> list[list[torch.Tensor]]:
    """Per-token weights, per rollout and sibling: mask / (rollout's masked tokens * R).

    R counts the step's rollouts with at least one masked token. A rollout with none (all of its
    tokens are tool or template tokens) contributes nothing and is not counted, so it does not
    dilute the others; its weights are 0. With these weights the step loss
    `sum(weight * token_loss * mask)` is mean over rollouts of (sum of masked token losses / count).
    """
    masks = [[torch.as_tensor(m, dtype=torch.float32).reshape(-1) for m in r] for r in rollout_masks]
    counts = [float(sum(m.sum().item() for m in r)) for r in masks]
    live = sum(1 for c in counts if c > 0)
    return [[m / (c * live) if c > 0 else torch.zeros_like(m) for m in r] for r, c in zip(masks, counts)]


def prepare_step(step: Sequence[Rollout], advantages: Sequence[torch.Tensor]) -> list[TrainSample]:
    """Flatten a step's rollouts into TrainSamples with their loss weights.

    `advantages` is per sample in the flattened order (as `advantages_for_samples(flat)` gives it).
    A rollout flagged as an infra failure (`metadata["infra_failure"]` on any sibling) is weighted
    like a rollout without masked tokens: weight 0, not counted, so it neither trains nor dilutes.
    """
    flat = [s for r in step for s in r]
    if len(advantages) != len(flat):
        raise ConfigError(f"prepare_step: {len(flat)} samples but {len(advantages)} advantage tensors")
    failed = [any(is_infra_failure(s.metadata.get("infra_failure")) for s in r) for r in step]
    masks = [[_mask(s) * (0.0 if f else 1.0) for s in r] for r, f in zip(step, failed)]
    weights = [w for r in loss_weights(masks) for w in r]
    out = []
    for s, a, w in zip(flat, advantages, weights):
        if a.numel() != s.response_length:
            raise ConfigError(f"prepare_step: sample {s.index} has {s.response_length} response tokens "
                              f"but {a.numel()} advantages")
        out.append(TrainSample(s, a.float().reshape(-1), w))
    return out


# ---- micro-batches ---------------------------------------------------------------------------


def micro_batches(items: Sequence[T], max_tokens_per_gpu: int) -> list[list[T]]:
    """Pack whole samples into micro-batches of at most `max_tokens_per_gpu` tokens (first-fit
    decreasing by length), instead of padding every sample to the longest.

    A sample longer than the budget gets a micro-batch of its own (it cannot be split without
    breaking its attention); the trainer must be able to run it, so size the budget to the
    longest sample you allow. Deterministic for a given input order.
    """
    if max_tokens_per_gpu < 1:
        raise ConfigError(f"--max-tokens-per-gpu must be >= 1, got {max_tokens_per_gpu}")
    order = sorted(range(len(items)), key=lambda i: -num_tokens(items[i]))
    bins: list[list[T]] = []
    loads: list[int] = []
    for i in order:
        n = num_tokens(items[i])
        for b, load in enumerate(loads):
            if load + n <= max_tokens_per_gpu:
                bins[b].append(items[i])
                loads[b] += n
                break
        else:
            bins.append([items[i]])
            loads.append(n)
    return bins


def shard_for_ranks(items: Sequence[T], world_size: int) -> list[list[T]]:
    """Split samples or micro-batches over `world_size` ranks, balancing tokens (largest first to
    the least-loaded rank). Items are never split; with at least `world_size` items every rank
    gets one. Rank r's share is `result[r]`."""
    if world_size < 1:
        raise ConfigError(f"shard_for_ranks: world_size must be >= 1, got {world_size}")
    shards: list[list[T]] = [[] for _ in range(world_size)]
    loads = [0] * world_size
    for i in sorted(range(len(items)), key=lambda i: -num_tokens(items[i])):
        r = min(range(world_size), key=lambda r: (loads[r], len(shards[r]), r))
        shards[r].append(items[i])
        loads[r] += num_tokens(items[i])
    return shards


def equalize_micro_batch_counts(per_rank: list[list[list[T]]]) -> list[list[list[T]]]:
    """Give every rank the same number of micro-batches, because FSDP ranks must run the same
    number of forward/backward passes (their collectives would hang otherwise). A rank short of
    micro-batches splits its micro-batch with most samples; if none has two, it gets an empty
    micro-batch, on which the trainer runs a zero-weight forward."""
    target = max((len(mbs) for mbs in per_rank), default=0)
    out = []
    for mbs in per_rank:
        mbs = [list(mb) for mb in mbs]
        while len(mbs) < target:
            k = max(range(len(mbs)), key=lambda i: len(mbs[i]), default=None)
            if k is None or len(mbs[k]) < 2:
                mbs.append([])
                continue
            big = mbs.pop(k)
            halves = shard_for_ranks(big, 2)
            mbs[k:k] = halves
        out.append(mbs)
    return out


def plan_micro_batches(items: Sequence[T], world_size: int, max_tokens_per_gpu: int) -> list[list[list[T]]]:
    """Shard a step's samples over ranks by tokens, pack each rank's share into micro-batches, and
    equalize the micro-batch counts. Returns `[rank][micro_batch][sample]`."""
    shards = shard_for_ranks(items, world_size)
    return equalize_micro_batch_counts([micro_batches(s, max_tokens_per_gpu) for s in shards])


# ---- packing ---------------------------------------------------------------------------------


@dataclass
class PackedBatch:
    """One row of concatenated samples, and the response tokens flattened in sample order.

    Row tensors are [1, T]; response tensors are [R] with R the sum of response lengths.
    `logits[0, logit_index]` are the logits predicting `targets` (position p predicts p + 1), so
    `losses.token_logprobs(logits[0, logit_index], targets)` gives the response log-probs aligned
    with `loss_mask`, `advantages`, `weights`, `rollout_log_probs` and `sample_index`.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    logit_index: torch.Tensor
    targets: torch.Tensor
    sample_index: torch.Tensor
    loss_mask: torch.Tensor
    response_lengths: list[int]
    rollout_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    weights: torch.Tensor | None = None

    @property
    def num_samples(self) -> int:
        return len(self.response_lengths)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments for a transformers causal LM forward on the packed row."""
        return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}

    def split(self, per_token: torch.Tensor) -> list[torch.Tensor]:
        """Cut a flat [R] tensor (e.g. old log-probs) back into one tensor per sample."""
        return list(torch.split(per_token, self.response_lengths))

    def to(self, device: torch.device | str) -> PackedBatch:
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()}
        return PackedBatch(**moved)


def pack(micro_batch: Sequence[Item]) -> PackedBatch:
    """Concatenate whole samples into one row (no padding); see `PackedBatch`.

    Every sample needs a non-empty prompt (the first response token is predicted from the last
    prompt position). `rollout_log_probs` is packed when every sample has it, `advantages` and
    `weights` when the items are TrainSamples.
    """
    samples = [x.sample if isinstance(x, TrainSample) else x for x in micro_batch]
    ids, pos, logit_index, targets, sample_index, masks, lps = [], [], [], [], [], [], []
    offset = 0
    for i, s in enumerate(samples):
        s.validate()
        n = len(s.tokens)
        if s.prompt_length < 1:
            raise ConfigError(f"pack: sample {s.index} (rollout {s.rollout_id!r}) has an empty prompt; "
                              "its first response token has no position to be predicted from")
        ids.append(torch.tensor(s.tokens, dtype=torch.long))
        pos.append(torch.arange(n, dtype=torch.long))
        logit_index.append(torch.arange(offset + s.prompt_length - 1, offset + n - 1, dtype=torch.long))
        targets.append(ids[-1][s.prompt_length :])
        sample_index.append(torch.full((s.response_length,), i, dtype=torch.long))
        masks.append(_mask(s))
        lps.append(None if s.rollout_log_probs is None else torch.tensor(s.rollout_log_probs, dtype=torch.float32))
        offset += n
    have = [lp is not None for lp in lps]
    if any(have) and not all(have):
        raise ConfigError("pack: some samples have rollout_log_probs and some do not; a step must be uniform")
    lengths = [s.response_length for s in samples]
    cu = torch.tensor([0] + [len(s.tokens) for s in samples], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    trains = [x for x in micro_batch if isinstance(x, TrainSample)]
    empty_f, empty_l = torch.zeros(0), torch.zeros(0, dtype=torch.long)
    return PackedBatch(
        input_ids=(torch.cat(ids) if ids else empty_l)[None],
        position_ids=(torch.cat(pos) if pos else empty_l)[None],
        cu_seqlens=cu,
        logit_index=torch.cat(logit_index) if ids else empty_l,
        targets=torch.cat(targets) if ids else empty_l,
        sample_index=torch.cat(sample_index) if ids else empty_l,
        loss_mask=torch.cat(masks) if ids else empty_f,
        response_lengths=lengths,
        rollout_log_probs=torch.cat(lps) if ids and all(have) else None,
        advantages=torch.cat([t.advantages for t in trains]) if trains and len(trains) == len(samples) else None,
        weights=torch.cat([t.weights for t in trains]) if trains and len(trains) == len(samples) else None,
    )
