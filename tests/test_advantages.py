"""Advantage estimators count each rollout once, keep infra failures out, and never emit NaN."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.errors import ConfigError
from vime.train.advantages import (
    advantages_for_samples,
    compute_advantages,
    discounted_returns,
    masked_whiten,
)
from vime.types import Sample


def ones(n: int) -> torch.Tensor:
    return torch.ones(n)


def scalars(adv) -> list[float]:
    """The sequence-level advantage of each sample (its first masked token)."""
    return [t[0].item() for t in adv.per_token]


def test_grpo_is_group_normalized_reward_with_unbiased_std():
    adv = compute_advantages("grpo", [1.0, 0.0, 5.0, 3.0], [0, 0, 1, 1], ["a", "b", "c", "d"], [ones(2)] * 4)
    std0, std1 = math.sqrt(0.5), math.sqrt(2.0)  # unbiased std of {1, 0} and of {5, 3}
    a0, a1 = 0.5 / (std0 + 1e-6), 1 / (std1 + 1e-6)
    assert scalars(adv) == pytest.approx([a0, -a0, a1, -a1])
    assert all(torch.equal(t, t[0].expand(2)) for t in adv.per_token)


def test_grpo_without_std_normalization_subtracts_the_group_mean():
    adv = compute_advantages("grpo", [1.0, 0.0, 0.5], [0, 0, 0], [1, 2, 3], [ones(1)] * 3, normalize_std=False)
    assert scalars(adv) == pytest.approx([0.5, -0.5, 0.0])


def test_gspo_uses_the_same_sequence_advantages_as_grpo():
    args = ([1.0, 0.0, 0.25], [0, 0, 0], [1, 2, 3], [ones(3)] * 3)
    grpo, gspo = compute_advantages("grpo", *args), compute_advantages("gspo", *args)
    assert all(torch.equal(a, b) for a, b in zip(grpo.per_token, gspo.per_token))


def test_single_rollout_groups_and_zero_spread_groups_get_zero_not_nan():
    adv = compute_advantages("grpo", [0.7, 0.1, 0.1, 0.1], [0, 1, 1, 1], [1, 2, 3, 4], [ones(2)] * 4)
    assert all(torch.equal(t, torch.zeros(2)) for t in adv.per_token)
    assert adv.stats["groups/degenerate"] == 2


def test_advantages_are_zero_on_unmasked_tokens():
    adv = compute_advantages("grpo", [1.0, 0.0], [0, 0], [1, 2], [torch.tensor([1, 0, 1]), torch.tensor([0, 1])])
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert adv.per_token[0].tolist() == pytest.approx([a, 0.0, a])
    assert adv.per_token[1].tolist() == pytest.approx([0.0, -a])


def test_uneven_fan_out_counts_each_rollout_once():
    # Rollout "a" fans out into three siblings; counting samples would give a group mean of 3/5.
    adv = compute_advantages(
        "grpo", [1.0, 1.0, 1.0, 0.0, 0.0], [7] * 5, ["a", "a", "a", "b", "c"], [ones(1)] * 5, normalize_std=False
    )
    assert scalars(adv) == pytest.approx([2 / 3, 2 / 3, 2 / 3, -1 / 3, -1 / 3])
    assert adv.stats["rollouts"] == 3


def test_siblings_with_rewards_of_their_own_are_scored_against_a_group_mean_that_counts_each_rollout_once():
    # A multi-agent rollout "a": 3 solvers, a rewriter and a selector, each scored on its own turn
    # (mean 0.6); rollouts "b" and "c" ended early with one sample each. Counting samples would
    # give a group mean of 3.0 / 7; each rollout counting once gives (0.6 + 0 + 0.3) / 3 = 0.3.
    rewards = [1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.3]
    adv = compute_advantages("grpo", rewards, [7] * 7, ["a"] * 5 + ["b", "c"], [ones(1)] * 7, normalize_std=False)
    assert scalars(adv) == pytest.approx([r - 0.3 for r in rewards])
    assert adv.stats["rollouts"] == 3 and adv.stats["rewards/mean"] == pytest.approx(0.3)


def test_the_std_of_a_group_with_uneven_fan_outs_weighs_each_rollout_once():
    # Rollout "a" splits its weight of one over its siblings: deviations from the mean 0.3 are
    # averaged within "a" (0.196), then summed with b's (0.09) and c's (0) over 3 - 1 rollouts.
    rewards = [1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.3]
    adv = compute_advantages("grpo", rewards, [7] * 7, ["a"] * 5 + ["b", "c"], [ones(1)] * 7)
    within_a = sum((r - 0.3) ** 2 for r in rewards[:5]) / 5
    std = math.sqrt((within_a + 0.3 ** 2 + 0.0) / 2)
    assert scalars(adv) == pytest.approx([(r - 0.3) / (std + 1e-6) for r in rewards])


def test_a_rollout_alone_in_its_group_gets_zero_even_when_its_siblings_differ():
    adv = compute_advantages("grpo", [1.0, 0.0, 0.5], [0] * 3, ["a"] * 3, [ones(2)] * 3)
    assert all(torch.equal(t, torch.zeros(2)) for t in adv.per_token)
    assert adv.stats["groups/degenerate"] == 1


def test_reinforce_plus_plus_credits_each_sibling_with_its_own_reward():
    adv = compute_advantages("reinforce_plus_plus", [1.0, 0.0], [None, None], ["a", "a"], [ones(1)] * 2)
    assert scalars(adv) == pytest.approx(_whiten_by_hand([1.0, 0.0]), abs=1e-5)


def test_infra_failures_are_out_of_the_statistics_and_get_zero():
    masks = [ones(2)] * 4
    clean = compute_advantages("grpo", [1.0, 0.0], [0, 0], [1, 2], masks[:2])
    adv = compute_advantages(
        "grpo", [1.0, 0.0, None, 5.0], [0, 0, 0, 0], [1, 2, 3, 4], masks,
        infra_failures=[None, "", "sandbox died", True],
    )
    assert scalars(adv)[:2] == scalars(clean)
    assert adv.per_token[2].tolist() == adv.per_token[3].tolist() == [0.0, 0.0]
    assert adv.stats["infra_failures"] == 2 and adv.stats["rewards/mean"] == 0.5


def test_missing_reward_without_infra_flag_is_an_error():
    with pytest.raises(ConfigError, match="has no reward"):
        compute_advantages("grpo", [1.0, None], [0, 0], [1, 2], [ones(1)] * 2)


def test_unknown_estimator_names_the_choices():
    with pytest.raises(ConfigError, match="'ppo' is not one of grpo, gspo"):
        compute_advantages("ppo", [1.0], [0], [1], [ones(1)])


def test_discounted_returns():
    assert discounted_returns(torch.tensor([1.0, 2.0, 3.0])).tolist() == [6.0, 5.0, 3.0]
    assert discounted_returns(torch.tensor([0.0, 0.0, 1.0]), gamma=0.5).tolist() == [0.25, 0.5, 1.0]


def test_masked_whiten_uses_masked_tokens_of_the_whole_batch():
    values = [torch.tensor([1.0, 99.0]), torch.tensor([3.0])]
    out = masked_whiten(values, [torch.tensor([1.0, 0.0]), torch.tensor([1.0])])
    assert out[0].tolist() == pytest.approx([-1.0, 0.0], abs=1e-6)
    assert out[1].tolist() == pytest.approx([1.0], abs=1e-6)


def _whiten_by_hand(values: list[float]) -> list[float]:
    mean, var = statistics.fmean(values), statistics.pvariance(values)
    return [(v - mean) / math.sqrt(var + 1e-8) for v in values]


def test_reinforce_plus_plus_returns_reward_minus_future_kl_then_whitened():
    # Sample 0: reward 1, kl_coef 0.5 -> token rewards -0.05, -0.1, (masked), 1 - 0.2.
    # Returns on masked tokens: 0.65, 0.7, 0.8. Sample 1: reward 0, no kl -> 0, 0.
    adv = compute_advantages(
        "reinforce_plus_plus", [1.0, 0.0], [None, None], [1, 2],
        [torch.tensor([1, 1, 0, 1]), ones(2)],
        kl=[torch.tensor([0.1, 0.2, 0.3, 0.4]), torch.zeros(2)], kl_coef=0.5,
    )
    w = _whiten_by_hand([0.65, 0.7, 0.8, 0.0, 0.0])
    assert adv.per_token[0].tolist() == pytest.approx([w[0], w[1], 0.0, w[2]], abs=1e-5)
    assert adv.per_token[1].tolist() == pytest.approx(w[3:], abs=1e-5)


def test_reinforce_plus_plus_baseline_subtracts_group_mean_then_whitens():
    adv = compute_advantages(
        "reinforce_plus_plus_baseline", [1.0, 0.0], [0, 0], [1, 2], [ones(2), ones(3)],
        kl=[torch.tensor([0.0, 0.2]), torch.zeros(3)], kl_coef=1.0,
    )
    w = _whiten_by_hand([0.5, 0.3, -0.5, -0.5, -0.5])
    assert torch.cat(adv.per_token).tolist() == pytest.approx(w, abs=1e-5)


def test_adapter_reads_samples_reward_key_and_infra_flag():
    def s(rid, reward, **meta):
        return Sample(group_index=0, rollout_id=rid, tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1],
                      reward=reward, metadata=meta)

    samples = [s("a", {"acc": 1.0}), s("b", {"acc": 0.0}), s("c", None, infra_failure="engine down")]
    adv = advantages_for_samples(samples, "grpo", reward_key="acc", normalize_std=False)
    assert scalars(adv) == [0.5, -0.5, 0.0]
    with pytest.raises(ConfigError, match="--reward-key"):
        advantages_for_samples(samples, "grpo")


@settings(max_examples=60, deadline=None)
@given(
    rollouts=st.lists(
        st.tuples(st.integers(0, 3), st.sampled_from([0.0, 0.5, 1.0, 2.0]), st.integers(1, 4), st.booleans()),
        min_size=1, max_size=12,
    ),
    normalize_std=st.booleans(),
)
def test_fan_out_gets_the_advantages_of_the_same_rollouts_without_fan_out(rollouts, normalize_std):
    """(group, reward, siblings, infra_failure) per rollout: siblings change nothing."""
    flat = dict(rewards=[], group_ids=[], rollout_ids=[], loss_masks=[], infra_failures=[])
    for k, (group, reward, siblings, failed) in enumerate(rollouts):
        for j in range(siblings):
            flat["rewards"].append(reward)
            flat["group_ids"].append(group)
            flat["rollout_ids"].append(k)
            flat["loss_masks"].append(torch.tensor([1, 0, 1][: 1 + j % 3]))
            flat["infra_failures"].append(failed)
    fanned = compute_advantages("grpo", normalize_std=normalize_std, **flat)
    single = compute_advantages(
        "grpo", [r[1] for r in rollouts], [r[0] for r in rollouts], list(range(len(rollouts))),
        [ones(1)] * len(rollouts), infra_failures=[r[3] for r in rollouts], normalize_std=normalize_std,
    )
    per_rollout = [t.item() for t in single.per_token]
    for rid, mask, tokens in zip(flat["rollout_ids"], flat["loss_masks"], fanned.per_token):
        assert not torch.isnan(tokens).any()
        assert tokens.tolist() == pytest.approx((mask * per_rollout[rid]).tolist())
