"""`Sample` keeps slime's fields and keeps its per-token lists aligned."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from vime.types import RolloutRef, Sample, SampleError, SampleRef

SLIME_FIELDS = [
    "group_index", "index", "rollout_id", "prompt", "tokens", "response", "response_length", "label",
    "reward", "loss_mask", "rollout_log_probs", "teacher_log_probs", "weight_versions", "status", "metadata", "session_id",
    "remove_sample", "train_metadata",
]


def test_sample_has_every_field_of_the_user_surface():
    assert [f.name for f in dataclasses.fields(Sample)] == SLIME_FIELDS
    assert [s.name for s in Sample.Status] == ["PENDING", "COMPLETED", "TRUNCATED", "ABORTED", "FAILED"]


def test_types_import_no_heavy_module():
    code = "import sys, vime.types; print(sorted(m for m in ('torch','numpy','transformers','vllm') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_appending_sampled_and_tool_tokens_keeps_masks_and_logprobs_aligned():
    s = Sample(prompt="p", tokens=[1, 2, 3])
    s.append_response_tokens([10, 11], [-0.1, -0.2], text="ab")
    s.append_response_tokens([20, 21, 22], loss_mask=0, text="<tool>")
    s.append_response_tokens([12], [-0.3])
    assert s.tokens == [1, 2, 3, 10, 11, 20, 21, 22, 12]
    assert s.response_length == 6 and s.prompt_length == 3
    assert s.response_tokens == [10, 11, 20, 21, 22, 12]
    assert s.loss_mask == [1, 1, 0, 0, 0, 1]
    assert s.rollout_log_probs == [-0.1, -0.2, 0.0, 0.0, 0.0, -0.3]
    assert s.response == "ab<tool>"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(token_ids=[1, 2], log_probs=[-0.1]), "1 log_probs for 2 token ids"),
        (dict(token_ids=[1, 2], log_probs=[-0.1, -0.1], loss_mask=[1]), "loss_mask has 1 entries for 2"),
        (dict(token_ids=[1], log_probs=[-0.1], loss_mask=[2]), "must be 0 or 1"),
        (dict(token_ids=[1]), "need log_probs"),
    ],
)
def test_inconsistent_appends_are_rejected_before_anything_changes(kwargs, message):
    s = Sample(tokens=[1])
    s.append_response_tokens([5], [-1.0])
    before = s.to_dict()
    with pytest.raises(SampleError, match=message):
        s.append_response_tokens(**kwargs)
    assert s.to_dict() == before


def test_logprobs_cannot_start_midway_through_sampled_tokens():
    s = Sample(tokens=[1])
    s.append_response_tokens([5])
    with pytest.raises(SampleError, match="earlier sampled tokens have no log_probs"):
        s.append_response_tokens([6], [-0.5])


def test_validate_names_the_field_that_breaks_the_invariant():
    with pytest.raises(SampleError, match="loss_mask has 1 entries but response_length=2"):
        Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1]).validate()
    with pytest.raises(SampleError, match="response_length=5 but tokens has 3"):
        Sample(tokens=[1, 2, 3], response_length=5).validate()


def test_to_dict_from_dict_round_trips_through_json():
    s = Sample(group_index=1, index=7, rollout_id="r-1", prompt=[{"role": "user", "content": "hi"}],
               tokens=[1, 2, 3], response="x", response_length=1, label="x", reward=1.0, loss_mask=[1],
               rollout_log_probs=[-0.5], weight_versions=[{"version": "3", "start": 0, "end": 1}],
               status=Sample.Status.TRUNCATED, metadata={"a": 1}, session_id="s", train_metadata={"b": 2})
    back = Sample.from_dict(json.loads(json.dumps(s.to_dict())))
    assert back == s
    assert back.status is Sample.Status.TRUNCATED


def test_from_dict_accepts_slime_style_status_names_and_rejects_unknown_fields():
    assert Sample.from_dict({"status": "COMPLETED"}).status is Sample.Status.COMPLETED
    with pytest.raises(SampleError, match="status 'done' is not one of"):
        Sample.from_dict({"status": "done"})
    with pytest.raises(SampleError, match=r"unknown fields \['bogus'\]"):
        Sample.from_dict({"bogus": 1})


def test_refs_are_small_and_carry_no_token_data():
    ref = RolloutRef("run", "r-1", [SampleRef("run", "r-1/0", "r-1", "completed", 1.0, 12)])
    assert ref.rewards == [1.0]
    assert len(json.dumps(dataclasses.asdict(ref))) < 400  # a few hundred bytes, whatever the length
