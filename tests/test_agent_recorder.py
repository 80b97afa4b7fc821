"""Per-step trajectory checkpoints and fan-out: what a resumed agent session and the trainer see."""

from __future__ import annotations

import copy

import pytest

from vime.agent.adapters.core import Segment, TurnBoundary
from vime.agent.fanout import fan_out, trajectory_to_samples
from vime.agent.recorder import TrajectoryRecorder
from vime.store import SampleStore


def _turn(seg: Segment, spliced: list[int], sampled: list[int], finish: str = "stop") -> None:
    seg.token_ids += spliced
    seg.loss_mask += [0] * len(spliced)
    seg.log_probs += [0.0] * len(spliced)
    start = len(seg.token_ids)
    seg.token_ids += sampled
    seg.loss_mask += [1] * len(sampled)
    seg.log_probs += [-0.5] * len(sampled)
    seg.turns.append(TurnBoundary(start, len(seg.token_ids), finish, [{"start": 0, "end": len(sampled), "version": 1}]))


@pytest.fixture
def store(tmp_path):
    with SampleStore.open(tmp_path / "vime.db") as s:
        s.ensure_run("run")
        yield s


def test_steps_saved_as_deltas_load_back_into_identical_segments(store):
    rec = TrajectoryRecorder(store, "run", "7")
    main = [Segment([1, 2, 3], [0, 0, 0], [0.0] * 3, 3)]
    chains = {"main": main}
    _turn(main[0], [], [10, 11])
    rec.save(chains, {"step": 1}, "diff-1")
    _turn(main[0], [4, 5], [12])
    chains["sub-1"] = [Segment([7, 8], [0, 0], [0.0, 0.0], 2, started_because="first turn")]
    _turn(chains["sub-1"][0], [], [20, 21, 22])
    rec.save(chains, {"step": 2}, "diff-2")

    turns = store.read_turns("run", "7")
    assert [len(t.token_ids) for t in turns] == [5, 3 + 5]  # each token stored once

    restored = TrajectoryRecorder(store, "run", "7").load()
    assert restored.next_turn == 2
    assert restored.agent_state == {"step": 2} and restored.diff == "diff-2"
    assert restored.chains == chains


def test_a_resumed_recorder_continues_after_the_last_stored_step(store):
    rec = TrajectoryRecorder(store, "run", "r")
    seg = Segment([1], [0], [0.0], 1)
    _turn(seg, [], [5])
    rec.save({"main": [seg]}, {"n": 1}, "")

    again = TrajectoryRecorder(store, "run", "r")
    restored = again.load()
    seg2 = copy.deepcopy(restored.chains["main"][0])
    _turn(seg2, [2], [6, 7])
    assert again.save({"main": [seg2]}, {"n": 2}, "d") == 1
    final = TrajectoryRecorder(store, "run", "r").load()
    assert final.chains["main"] == [seg2]
    assert final.agent_state == {"n": 2}


def test_nothing_stored_restores_to_an_empty_start(store):
    restored = TrajectoryRecorder(store, "run", "none").load()
    assert restored.next_turn == 0 and restored.chains == {} and restored.agent_state is None


def test_fan_out_names_subagent_wipe_and_final_segments_and_shares_the_reward():
    wipe = Segment([1, 2], [0, 0], [0.0, 0.0], 2)
    _turn(wipe, [], [3])
    final = Segment([1, 9], [0, 0], [0.0, 0.0], 2, started_because="compaction")
    _turn(final, [], [4, 5])
    sub = Segment([8], [0], [0.0], 1)
    _turn(sub, [], [6])
    chains = {"main": [wipe, final], "sub-1": [sub]}

    assert [(x.chain, x.kind) for x in fan_out(chains)] == [("sub-1", "subagent"), ("main", "wipe"), ("main", "final")]

    samples = trajectory_to_samples(chains, rollout_id="r1", reward=1.0)
    assert [s.metadata["segment_kind"] for s in samples] == ["subagent", "wipe", "final"]
    assert {s.rollout_id for s in samples} == {"r1"}
    assert [s.reward for s in samples] == [1.0, 1.0, 1.0]
    assert samples[2].tokens == [1, 9, 4, 5] and samples[2].loss_mask == [1, 1]
    assert samples[2].rollout_log_probs == [-0.5, -0.5]
    assert trajectory_to_samples({}, rollout_id="r", reward=0.0) == []
