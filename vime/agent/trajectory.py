"""From an adapter session's segments to the `Sample`s a generate hook returns.

Each segment is one trainable sequence: its prompt (everything before the first sampled
token) is the sample's prompt, the rest its response, with the segment's own loss mask and
logprobs. A session with several segments is a fan-out: the samples share `rollout_id` (and
the rollout's reward), so the trainer keeps them in one step and weighs the rollout once.
"""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

from vime.agent.adapters.core import Segment
from vime.types import Sample


def _response_weight_versions(segment: Segment) -> list[Any]:
    """vLLM's spans count from each turn's first sampled token; re-base them on the response."""
    spans: list[Any] = []
    for turn in segment.turns:
        offset = turn.start - segment.prompt_length
        for span in turn.weight_versions:
            if isinstance(span, dict) and isinstance(span.get("start"), int) and isinstance(span.get("end"), int):
                span = {**span, "start": span["start"] + offset, "end": span["end"] + offset}
            spans.append(span)
    return spans


def segment_to_sample(segment: Segment, sample: Sample, *, tokenizer: Any = None) -> Sample:
    """Fill `sample` (in place) with `segment`'s tokens, mask, logprobs and turn boundaries."""
    pl = segment.prompt_length
    if not (len(segment.token_ids) == len(segment.loss_mask) == len(segment.log_probs)) or pl > len(segment.token_ids):
        raise ValueError(f"segment has {len(segment.token_ids)} tokens, {len(segment.loss_mask)} mask entries, "
                         f"{len(segment.log_probs)} logprobs and prompt_length {pl}; they must line up")
    sample.tokens = list(segment.token_ids)
    sample.response_length = len(segment.token_ids) - pl
    sample.loss_mask = list(segment.loss_mask[pl:])
    sample.rollout_log_probs = list(segment.log_probs[pl:])
    sample.weight_versions = _response_weight_versions(segment)
    last = segment.turns[-1].finish_reason if segment.turns else "stop"
    sample.status = Sample.Status.TRUNCATED if last == "length" else Sample.Status.COMPLETED
    if tokenizer is not None:
        sample.response = tokenizer.decode(sample.response_tokens, skip_special_tokens=False)
    sample.metadata = {
        **sample.metadata,
        "turns": [dataclasses.asdict(t) for t in segment.turns],
        "started_because": segment.started_because,
    }
    sample.validate()
    return sample


def segments_to_samples(
    segments: list[Segment],
    *,
    rollout_id: str | int,
    reward: float | dict | None = None,
    prompt: str | list[dict] | None = None,
    group_index: int | None = None,
    index: int | None = None,
    base: Sample | None = None,
    tokenizer: Any = None,
) -> list[Sample]:
    """One `Sample` per segment, in order, all with `rollout_id` and `reward`.

    `base` (typically the sample the generate hook received) provides every other field
    (label, session_id, metadata...) and is not modified; `prompt`, `group_index` and `index`
    override its values when given. `metadata` gains `turns` (token boundaries of each sampled
    turn, absolute in `tokens`), `started_because`, `segment_index` and `num_segments`.
    `tokenizer`, when given, decodes `response` for display and rewards. An empty list gives
    an empty list: a session that never sampled has nothing to train on.
    """
    samples = []
    for i, segment in enumerate(segments):
        sample = copy.deepcopy(base) if base is not None else Sample()
        sample.rollout_id = rollout_id
        sample.reward = copy.deepcopy(reward)
        if prompt is not None:
            sample.prompt = copy.deepcopy(prompt)
        if group_index is not None:
            sample.group_index = group_index
        if index is not None:
            sample.index = index
        sample.metadata = {**(sample.metadata or {}), "segment_index": i, "num_segments": len(segments)}
        samples.append(segment_to_sample(segment, sample, tokenizer=tokenizer))
    return samples
