"""Fan-out: one agent trajectory becomes several trainable segments of one rollout.

An agent run is rarely one token sequence. Each subagent talks to the model in its own chain;
a compaction replaces the main chain's history, so the chain before it is frozen (a "wipe");
and the chain that ends the run is the "final" one. The adapter already records each of these
as its own `Segment` (a turn that does not extend what vLLM saw starts a new one), so the
middleware's job is to name them and turn them into `Sample`s:

- kind "subagent": every segment of a chain other than "main";
- kind "wipe": every segment of "main" but its last (frozen before a compaction, or before any
  other break in the history);
- kind "final": the last segment of "main".

Reward: every segment gets the rollout's reward, unscaled. The segments of a rollout share
`rollout_id`, so the trainer keeps them in one step, counts the rollout once in the group's
advantage statistics, and weighs it as one token-weighted mean; a subagent's tokens are credited
with the outcome of the run they served. That is the simplest choice that cannot be gamed by
splitting work into more chains, and the one slime / SkyRL users expect from multi-segment
trajectories.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.agent.adapters.core import Segment
from vime.agent.trajectory import segments_to_samples
from vime.types import Sample

MAIN_CHAIN = "main"
SEGMENT_KINDS = ("subagent", "wipe", "final")


@dataclass(frozen=True)
class LabeledSegment:
    chain: str
    kind: str  # one of SEGMENT_KINDS
    segment: Segment


def fan_out(chains: dict[str, list[Segment]]) -> list[LabeledSegment]:
    """The segments of every chain, labeled; subagents first, then wipes, then the final chain."""
    subagents = [LabeledSegment(name, "subagent", seg)
                 for name, segments in chains.items() if name != MAIN_CHAIN for seg in segments]
    main = chains.get(MAIN_CHAIN, [])
    wipes = [LabeledSegment(MAIN_CHAIN, "wipe", seg) for seg in main[:-1]]
    final = [LabeledSegment(MAIN_CHAIN, "final", main[-1])] if main else []
    return subagents + wipes + final


def trajectory_to_samples(
    chains: dict[str, list[Segment]],
    *,
    rollout_id: str | int,
    reward: float | dict | None,
    base: Sample | None = None,
    tokenizer: Any = None,
) -> list[Sample]:
    """`list[Sample]` for a generate hook: one per labeled segment, all sharing `rollout_id` and
    `reward`; `metadata` gains `chain` and `segment_kind`. No segments, no samples."""
    labeled = fan_out(chains)
    samples = segments_to_samples([item.segment for item in labeled], rollout_id=rollout_id,
                                  reward=reward, base=base, tokenizer=tokenizer)
    for sample, item in zip(samples, labeled):
        sample.metadata["chain"] = item.chain
        sample.metadata["segment_kind"] = item.kind
    return samples
