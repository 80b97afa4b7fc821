"""What the rollout activity stores of a group, and what it generates again instead.

A group is stored once and is final: a sample the infrastructure failed (a dead server, a
request vLLM aborted because its server was stopping) is not stored; the activity fails
retryably and the group is generated again.
"""

from __future__ import annotations

from activities.rollout import _infra_cause
from vime.types import Sample


def sample(status: Sample.Status = Sample.Status.COMPLETED, **metadata) -> Sample:
    return Sample(status=status, metadata=dict(metadata))


def test_a_group_of_finished_samples_is_stored():
    assert _infra_cause([[sample(), sample(Sample.Status.TRUNCATED)], [sample(Sample.Status.FAILED)]]) is None


def test_a_sample_vllm_aborted_is_generated_again_not_stored_unscored():
    """A kill -9 of the launcher stopped vLLM mid-request: the aborted sample was stored without
    a reward and every rerun stopped at that step's training ("has no reward")."""
    assert _infra_cause([[sample(), sample(Sample.Status.ABORTED)]]) == (1, "vLLM aborted the request")


def test_an_infrastructure_failure_is_counted_with_its_cause():
    assert _infra_cause([[sample(Sample.Status.FAILED, infra_failure="server died"), sample()],
                         [sample(Sample.Status.ABORTED)]]) == (2, "server died")


def test_the_trainer_leaves_out_an_aborted_sample_a_run_stored_before():
    from vime.train.trainer_group import trainable

    tokens = dict(tokens=[1, 2, 3], response_length=1)
    done = Sample(status=Sample.Status.COMPLETED, reward=1.0, **tokens)
    assert trainable(done)
    assert not trainable(Sample(status=Sample.Status.ABORTED, **tokens))
