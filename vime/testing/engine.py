"""An `EngineClient` that keeps what vLLM returned, to check exported trajectories against it.

Not a fake: every request goes to the real server. Tests of the agent adapters pass it as
`engine=` and then check, id for id, that the segments a session exports are the prompts the
engine received and the tokens it sampled (`check_segments_against_engine`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vime.engine.client import EngineClient, GenerateOutput


@dataclass
class EngineCall:
    prompt_ids: list[int]
    sampling_params: dict[str, Any]
    session_id: str | None
    output: GenerateOutput


class RecordingEngineClient(EngineClient):
    """`EngineClient` that appends each successful `generate` to `.calls`."""

    def __init__(self, base_url: str, **kwargs: Any) -> None:
        super().__init__(base_url, **kwargs)
        self.calls: list[EngineCall] = []

    async def generate(self, token_ids: list[int], sampling_params: dict[str, Any] | None = None, *,
                       session_id: str | None = None, request_id: str | None = None,
                       model: str | None = None) -> GenerateOutput:
        out = await super().generate(token_ids, sampling_params, session_id=session_id, request_id=request_id,
                                     model=model)
        self.calls.append(EngineCall(list(token_ids), dict(sampling_params or {}), session_id, out))
        return out


def check_segments_against_engine(segments: list, calls: list[EngineCall]) -> None:
    """Assert that `segments` are exactly `calls`: each call is one turn of one segment, in order;
    the segment's tokens before the turn are the prompt vLLM got, the turn's tokens and logprobs
    are what it returned, and the loss mask is 1 on exactly the sampled tokens."""
    next_turn = [0] * len(segments)
    for k, call in enumerate(calls):
        matches = []
        for i, seg in enumerate(segments):
            if next_turn[i] < len(seg.turns):
                turn = seg.turns[next_turn[i]]
                if (seg.token_ids[:turn.start] == call.prompt_ids
                        and seg.token_ids[turn.start:turn.end] == call.output.token_ids
                        and seg.log_probs[turn.start:turn.end] == call.output.log_probs
                        and turn.finish_reason == call.output.finish_reason):
                    matches.append(i)
        assert matches, f"engine call {k} ({len(call.output.token_ids)} tokens) is in no segment's next turn"
        next_turn[matches[0]] += 1
    for i, seg in enumerate(segments):
        assert next_turn[i] == len(seg.turns), f"segment {i} has turns the engine never sampled"
        n = len(seg.token_ids)
        assert len(seg.loss_mask) == len(seg.log_probs) == n
        sampled = set()
        for turn in seg.turns:
            sampled.update(range(turn.start, turn.end))
        assert {j for j in range(n) if seg.loss_mask[j] == 1} == sampled
        assert all(seg.loss_mask[j] == 0 and seg.log_probs[j] == 0.0 for j in range(n) if j not in sampled)
        assert seg.prompt_length == seg.turns[0].start
