"""`vime show` renders every environment's samples: each environment writes its own turns into
`metadata` (token offsets, text and observations, one role's turn per sample), and one store
holds them all, so `show` prints what a turn has instead of assuming one shape. Each sample is
made by the environment's own code (or as it makes it), written to a SQLite store and read back
as `vime show` reads it; no tokenizer, no Temporal, no vLLM."""

from __future__ import annotations

from pathlib import Path

import pytest

from vime.agent.adapters.core import Segment, TurnBoundary
from vime.agent.fanout import trajectory_to_samples
from vime.envs.multi_agent import task as multi_agent_task
from vime.envs.tool_use.rollout import _Turn, model_text, replay
from vime.ops.show import ShownSample, load, render
from vime.store import SampleStore
from vime.types import Sample

RUN = "show"


def shown(tmp_path: Path, samples: list[Sample]) -> str:
    """The samples stored as one rollout (metadata through the store's JSON), rendered as `vime
    show RUN rollout` prints them without a tokenizer or colour."""
    with SampleStore.open(str(tmp_path / "run")) as store:
        store.ensure_run(RUN, {})
        store.write_rollouts(RUN, {"r": samples})
        loaded = load(store, RUN, "r")
    return "\n\n".join(render(one, None, color=False, token_table=False) for one in loaded)


def test_a_coding_agent_sample_shows_each_turns_response_tokens_and_its_chain(tmp_path):
    """An adapter session (the coding agent) records each sampled turn's token offsets, absolute
    in the segment's tokens; shown counted from the response's start."""
    prompt, turn_1, tool_output, turn_2 = [1, 2, 3], [10, 11, 12, 13], [20, 21], [30, 31, 32]
    segment = Segment(token_ids=prompt + turn_1 + tool_output + turn_2, loss_mask=[0] * 3 + [1] * 4 + [0] * 2 + [1] * 3,
                      log_probs=[0.0] * 3 + [-0.5] * 4 + [0.0] * 2 + [-0.5] * 3, prompt_length=3,
                      turns=[TurnBoundary(3, 7, "tool_calls", [{"version": 3, "start": 0, "end": 4}]),
                             TurnBoundary(9, 12, "stop", [{"version": 4, "start": 0, "end": 3}])])
    base = Sample(prompt="fix chunks()", metadata={"task_id": "chunks", "diff": "--- a/chunking.py\n",
                                                   "grade": {"outcome": "passed", "reason": "tests pass"}})
    samples = trajectory_to_samples({"main": [segment]}, rollout_id="r", reward=1.0, base=base)
    assert samples[0].metadata["turns"][0]["start"] == 3, "the shape this test is about"
    out = shown(tmp_path, samples)
    assert "── turns (2) ──" in out and "chain main, final segment, started because: first turn" in out
    assert "0: response tokens 0-4, tool_calls" in out and "1: response tokens 6-9, stop" in out
    assert "--- a/chunking.py" in out


def test_a_tool_use_sample_shows_each_turns_text_observation_and_finish(tmp_path):
    """tool_use records what each turn wrote and what the tool answered, with no token offsets
    (`show` used to fail on it with KeyError: 'start'), and which activity attempt sampled it."""
    sample = Sample(prompt="What is 37*58?", tokens=[1, 2, 3], label="2146", metadata={})
    replay(sample, [
        _Turn([10, 11, 12, 20, 21], [1, 1, 1, 0, 0], [-0.5, -0.5, -0.5, 0.0, 0.0],
              {"text": "<code>print(37*58)</code>", "observation": "<output>\n2146\n</output>\n",
               "finish_reason": "stop", "done": False, "status": "completed", "weight_versions": [3]}),
        _Turn([30, 31], [1, 1], [-0.5, -0.5],
              {"text": "Answer: 2146", "observation": "", "finish_reason": "stop", "done": True,
               "status": "completed", "weight_versions": [3], "sampled_by": "1#2", "worker": "w2"}),  # a retry's
    ])
    sample.metadata.update(tool_calls=1, resumed_at=0, env="tool_use")
    sample.reward = 1.0 if model_text(sample).endswith("2146") else 0.0
    assert set(sample.metadata["turns"][0]) == {"text", "observation", "finish"}, "the shape this test is about"
    out = shown(tmp_path, [sample])
    assert "── turns (2) ──" in out and "response tokens" not in out
    assert "0: stop\n   [model] <code>print(37*58)</code>\n   [observation] <output>\n   2146\n   </output>" in out
    assert "1: stop, activity 1, attempt 2 (a retry) on worker w2\n   [model] Answer: 2146" in out
    assert "[observation]" not in out.split("1: stop")[1]
    assert "sampled by: activity 1, attempt 2 (a retry) on worker w2" in out, "the sample's: its turns' attempts"


def test_multi_agent_samples_show_each_roles_turn_slot_score_pick_and_attempt(tmp_path):
    """multi_agent stores one sample per role's turn (no `turns` list): `metadata` names the
    role, its slot, the turn of the rollout and its score; the selector's, what it picked; and
    `sampled_by` ("<activity id>#<attempt>") with `worker`, which activity attempt sampled it on
    which worker: attempt 2 is a role a retry sampled after its first attempt failed."""
    def role_turn(role: str, slot: int, turn: int, score: float, **extra) -> Sample:
        return Sample(prompt=[{"role": "user", "content": f"{role} prompt"}], tokens=[1, 2, 3, 4], response="ANSWER",
                      response_length=2, loss_mask=[1, 1], rollout_log_probs=[-0.5, -0.5], weight_versions=[3],
                      status=Sample.Status.COMPLETED,
                      metadata={"role": role, "slot": slot, "turn": turn, "score": score,
                                "sampled_by": f"{role}s#1", "weight_version": 3, **extra})

    samples = [role_turn("solver", 0, 0, 0.5), role_turn("solver", 1, 1, 1.0),
               role_turn("rewriter", 0, 2, 1.0, sampled_by="2#2", worker="rollout-7@host-b"),
               role_turn("selector", 0, 3, 1.0, pick="B", picked_turn=1)]
    multi_agent_task.assign_rewards(samples, correct_weight=1.0, incorrect_weight=0.5)
    out = shown(tmp_path, samples)
    assert "role: solver (slot 1), turn 1 of the rollout, score 1" in out
    assert "role: rewriter (slot 0), turn 2 of the rollout, score 1\n" \
           "sampled by: activity 2, attempt 2 (a retry) on worker rollout-7@host-b" in out
    assert "role: selector (slot 0), turn 3 of the rollout, score 1, picked B (turn 1)" in out
    assert "sampled by: activity solvers, attempt 1\n" in out
    assert "── turns" not in out


@pytest.mark.parametrize("turns", [
    [{"start": 3, "end": 5}],  # offsets and nothing else
    [{"tool": "grep", "seconds": 0.2}],  # an environment of one's own: keys show knows nothing of
    ["a turn as a string", 7],
    3,  # a count, not a list
], ids=["offsets-only", "unknown-keys", "not-dicts", "a-count"])
def test_a_turn_of_any_other_shape_is_printed_not_a_crash(turns):
    """A user's environment may write any JSON there: `show` prints it as it is."""
    sample = Sample(prompt="p", tokens=[1, 2, 3, 4, 5], response="r", response_length=2, metadata={"turns": turns})
    out = render(ShownSample("r/0", sample, None), None, color=False, token_table=False)
    assert "── turns (" in out
    if turns == [{"tool": "grep", "seconds": 0.2}]:
        assert '0: turn\n   {"tool": "grep", "seconds": 0.2}' in out
    if turns == [{"start": 3, "end": 5}]:
        assert "0: response tokens 0-2" in out
