"""Per-step checkpoints of an agent session in the sample store, so a retried session resumes.

An agent session is long (minutes to hours) and its worker can die at any time. After every
agent step (a model turn and the tools it called) the session saves one stored *turn*
(`SampleStore.append_turn`) holding:

- the tokens the step added to the adapter's segments, per chain (main, sub-1, ...): only the
  delta, so a long session stores each token once;
- the agent's own state (its conversation, counters) as JSON;
- the workspace as a diff against the task's base commit.

`load()` replays the stored turns into the same three things, so a new attempt restores the
sandbox from the diff, reopens the adapter sessions with their segments, and continues the
agent after its last stored step. A step that was running when the worker died is simply
sampled again: its tokens were never stored, and neither was anything that depended on them.

`load` and `save` are synchronous store calls that can wait for the database's write lock:
async code runs them in a thread (`vime.temporal.store_calls.store_call`), never on its event loop.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from vime.agent.adapters.core import Segment, TurnBoundary
from vime.store import SampleStore


@dataclass
class Restored:
    """What the stored turns of a rollout add up to; `next_turn` is 0 when nothing is stored."""

    next_turn: int = 0
    chains: dict[str, list[Segment]] = field(default_factory=dict)
    agent_state: dict[str, Any] | None = None
    diff: str = ""
    attempts: list[str] = field(default_factory=list)  # per stored step: the session attempt that stored it
    workers: list[str] = field(default_factory=list)  # per stored step: the worker that ran that attempt


@dataclass
class _Stored:
    tokens: int = 0
    turns: int = 0


class TrajectoryRecorder:
    """Saves and loads the per-step checkpoints of one rollout (`run_id`, `rollout_id`)."""

    def __init__(self, store: SampleStore, run_id: str, rollout_id: str) -> None:
        self.store, self.run_id, self.rollout_id = store, run_id, rollout_id
        self._next_turn = 0
        self._stored: dict[tuple[str, int], _Stored] = {}

    def load(self) -> Restored:
        """Replay every stored turn; afterwards `save` continues after the last one."""
        restored = Restored()
        for turn in self.store.read_turns(self.run_id, self.rollout_id):
            offset = 0
            for delta in turn.meta["deltas"]:
                n = delta["length"]
                segments = restored.chains.setdefault(delta["chain"], [])
                if delta["segment"] == len(segments):
                    segments.append(Segment([], [], [], delta["prompt_length"], [], delta["started_because"]))
                seg = segments[delta["segment"]]
                seg.token_ids += turn.token_ids[offset:offset + n]
                seg.loss_mask += turn.loss_mask[offset:offset + n]
                seg.log_probs += (turn.log_probs or [0.0] * len(turn.token_ids))[offset:offset + n]
                seg.turns += [TurnBoundary(**t) for t in delta["turns"]]
                offset += n
            restored.agent_state = turn.meta["agent_state"]
            restored.diff = turn.meta["diff"]
            restored.attempts.append(turn.meta.get("attempt", ""))
            restored.workers.append(turn.meta.get("worker", ""))
            restored.next_turn = turn.turn + 1
        self._next_turn = restored.next_turn
        self._stored = {
            (chain, i): _Stored(len(seg.token_ids), len(seg.turns))
            for chain, segments in restored.chains.items() for i, seg in enumerate(segments)
        }
        return restored

    def save(self, chains: dict[str, list[Segment]], agent_state: dict[str, Any], diff: str,
             attempt: str = "", worker: str = "") -> int:
        """Store one step: what `chains` gained since the last save, the agent state and the diff
        (and `attempt`, naming the session attempt that stored it, "<activity id>#<attempt>", and
        `worker`, the identity of the worker that ran it). Returns the stored turn's number.
        Idempotent per turn number (the first write wins)."""
        token_ids: list[int] = []
        loss_mask: list[int] = []
        log_probs: list[float] = []
        deltas = []
        for chain, segments in chains.items():
            for i, seg in enumerate(segments):
                done = self._stored.get((chain, i), _Stored())
                if len(seg.token_ids) == done.tokens and len(seg.turns) == done.turns:
                    continue
                token_ids += seg.token_ids[done.tokens:]
                loss_mask += seg.loss_mask[done.tokens:]
                log_probs += seg.log_probs[done.tokens:]
                deltas.append({
                    "chain": chain, "segment": i, "length": len(seg.token_ids) - done.tokens,
                    "prompt_length": seg.prompt_length, "started_because": seg.started_because,
                    "turns": [asdict(t) for t in seg.turns[done.turns:]],
                })
        turn = self._next_turn
        self.store.append_turn(self.run_id, self.rollout_id, turn, token_ids, loss_mask, log_probs,
                               {"deltas": deltas, "agent_state": agent_state, "diff": diff, "attempt": attempt,
                                **({"worker": worker} if worker else {})})
        for chain, segments in chains.items():
            for i, seg in enumerate(segments):
                self._stored[(chain, i)] = _Stored(len(seg.token_ids), len(seg.turns))
        self._next_turn = turn + 1
        return turn
