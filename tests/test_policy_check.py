"""A group sampled from weights older than its step allows is sampled again, never stored.

The end-to-end drills (a relaunch whose vLLM boots the base checkpoint while the run stands at
step k) are in tests/test_chaos.py; these pin the rule itself.
"""

from __future__ import annotations

import pytest

from vime.errors import ServiceError
from vime.rollout.policy_check import StalePolicyError, check_on_policy, is_stale, sampled_versions, stale_report
from vime.types import Sample


def sampled(*versions) -> Sample:
    return Sample(weight_versions=[{"version": v, "start": 0, "end": 1} for v in versions])


def test_vllm_reports_the_base_checkpoint_as_default_which_is_version_0():
    assert sampled_versions(sampled("default")) == [0]
    assert sampled_versions(sampled("3", "4")) == [3, 4]
    assert sampled_versions(sampled("not-a-version")) == [None]


def test_a_sample_older_than_the_groups_start_version_is_stale_and_a_newer_one_is_not():
    assert is_stale(sampled("default"), 5)  # a relaunched server, not synced yet
    assert is_stale(sampled("4", "5"), 5)  # a session that spans an old server
    assert not is_stale(sampled("5"), 5)
    assert not is_stale(sampled("6"), 5)  # the servers moved on while the group ran (--max-staleness)
    assert not is_stale(sampled("default"), 0)  # the run's first policy is the checkpoint served
    assert is_stale(sampled("weird"), 0)  # not a version vime pushed: not on any policy it knows


def test_a_sample_without_any_reported_version_cannot_be_checked_and_passes():
    assert not is_stale(Sample(), 7)  # a custom generate hook calling its own engine


def test_a_stale_group_raises_a_retryable_error_that_names_the_group_and_the_versions():
    with pytest.raises(StalePolicyError) as e:
        check_on_policy([sampled("5"), sampled("default"), sampled("default")], 5, "group 12 of step 5")
    assert isinstance(e.value, ServiceError)  # Temporal retries it: the next try samples again
    message = str(e.value)
    assert message.startswith("group 12 of step 5: 2 sample(s) came from policy version default")
    assert "needs version 5 or newer" in message
    check_on_policy([sampled("5"), sampled("6")], 5, "group 13 of step 5")  # on policy: no error


def test_the_trainer_refuses_in_the_same_words_the_rollout_side_retries_in():
    assert stale_report([sampled("5")], 5) is None
    assert stale_report([sampled("3", "4"), sampled("5")], 5) == \
        "1 sample(s) came from policy version 3-4, the step needs version 5 or newer"
