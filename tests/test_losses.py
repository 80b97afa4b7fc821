"""Per-token losses: PPO-clip with clip-higher, GSPO ratio, KL estimators, TIS, MIS, entropy, SFT."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from vime.config.args import parse_args
from vime.errors import ConfigError
from vime.train.losses import (
    LossConfig,
    compute_loss,
    entropy_from_logits,
    gspo_log_ratio,
    kl_divergence,
    mis_mask,
    ppo_clip_loss,
    tis_weights,
    token_logprobs,
)


def leaf(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32, requires_grad=True)


# ---- log-probs and entropy -------------------------------------------------------------------


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_token_logprobs_match_log_softmax_in_value_and_gradient(temperature):
    torch.manual_seed(0)
    logits = torch.randn(13, 50, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 50, (13,))
    ref = torch.log_softmax(logits / temperature, -1).gather(-1, targets[:, None]).squeeze(-1)
    got = token_logprobs(logits, targets, temperature, chunk_size=4)
    assert torch.allclose(got, ref, atol=1e-10)
    g = torch.randn(13, dtype=torch.float64)
    (grad_ref,) = torch.autograd.grad((ref * g).sum(), logits)
    (grad,) = torch.autograd.grad((got * g).sum(), logits)
    assert torch.allclose(grad, grad_ref, atol=1e-10)


def test_logprob_and_entropy_gradients_pass_gradcheck():
    logits = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 7, (5,))
    assert torch.autograd.gradcheck(lambda x: token_logprobs(x, targets, 0.6, chunk_size=2), (logits,))
    assert torch.autograd.gradcheck(lambda x: entropy_from_logits(x, 0.6, chunk_size=2), (logits,))


def test_token_logprobs_keep_batch_shape_and_accept_bf16():
    logits = torch.randn(2, 3, 17).bfloat16()
    targets = torch.randint(0, 17, (2, 3))
    got = token_logprobs(logits, targets)
    assert got.shape == (2, 3) and got.dtype == torch.float32
    ref = torch.log_softmax(logits.float(), -1).gather(-1, targets[..., None]).squeeze(-1)
    assert torch.allclose(got, ref, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 1.3])
def test_entropy_from_logits_matches_reference_in_value_and_gradient(temperature):
    torch.manual_seed(1)
    logits = torch.randn(9, 31, dtype=torch.float64, requires_grad=True)
    logp = torch.log_softmax(logits / temperature, -1)
    ref = -(logp.exp() * logp).sum(-1)
    got = entropy_from_logits(logits, temperature, chunk_size=2)
    assert torch.allclose(got, ref, atol=1e-10)
    g = torch.randn(9, dtype=torch.float64)
    (grad_ref,) = torch.autograd.grad((ref * g).sum(), logits)
    (grad,) = torch.autograd.grad((got * g).sum(), logits)
    assert torch.allclose(grad, grad_ref, atol=1e-10)


def test_entropy_of_uniform_logits_is_log_vocab():
    assert entropy_from_logits(torch.zeros(3, 8)).tolist() == pytest.approx([math.log(8)] * 3)


# ---- KL --------------------------------------------------------------------------------------


def test_kl_estimators_against_hand_values():
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])  # log r = ln 2
    ln2 = math.log(2)
    assert kl_divergence(logp, ref, "k1").item() == pytest.approx(ln2)
    assert kl_divergence(logp, ref, "k2").item() == pytest.approx(ln2**2 / 2)
    assert kl_divergence(logp, ref, "k3").item() == pytest.approx(0.5 - 1 + ln2)
    assert kl_divergence(logp, ref, "low_var_kl").item() == pytest.approx(0.5 - 1 + ln2)


def test_k3_is_nonnegative_and_low_var_kl_is_clamped_to_ten():
    logp, ref = torch.tensor([-30.0, 0.0, -1.0]), torch.tensor([0.0, -30.0, -1.0])
    k3 = kl_divergence(logp, ref, "k3")
    assert (k3 >= 0).all() and k3[0] > 1e12 and k3[2] == 0
    assert kl_divergence(logp, ref, "low_var_kl").tolist() == pytest.approx([10.0, 10.0, 0.0])


def test_unknown_kl_type_is_an_error():
    with pytest.raises(ConfigError, match="--kl-loss-type 'k4'"):
        kl_divergence(torch.zeros(1), torch.zeros(1), "k4")


# ---- PPO clip --------------------------------------------------------------------------------


def test_ratio_above_clip_high_with_positive_advantage_has_zero_gradient():
    logp = leaf([math.log(1.5)])
    loss, clipped = ppo_clip_loss(logp - 0.0, torch.tensor([1.0]), eps_clip=0.2, eps_clip_high=0.28)
    loss.sum().backward()
    assert loss.item() == pytest.approx(-1.28) and clipped.item() == 1.0
    assert logp.grad.item() == 0.0


def test_clip_higher_leaves_room_that_symmetric_clipping_removes():
    log_ratio = torch.tensor([math.log(1.25)])
    _, sym = ppo_clip_loss(log_ratio, torch.tensor([1.0]), eps_clip=0.2)
    _, asym = ppo_clip_loss(log_ratio, torch.tensor([1.0]), eps_clip=0.2, eps_clip_high=0.28)
    assert sym.item() == 1.0 and asym.item() == 0.0


def test_inside_the_trust_region_the_gradient_is_minus_advantage_times_ratio():
    logp = leaf([math.log(1.1), math.log(0.5)])
    adv = torch.tensor([2.0, -1.0])
    loss, clipped = ppo_clip_loss(logp, adv, eps_clip=0.2)
    loss.sum().backward()
    # token 0: unclipped; token 1: ratio 0.5 < 0.8 with A<0 -> clipped, constant, zero gradient
    assert logp.grad.tolist() == pytest.approx([-2.0 * 1.1, 0.0])
    assert clipped.tolist() == [0.0, 1.0]


def test_dual_clip_bounds_negative_advantage_loss():
    loss, _ = ppo_clip_loss(torch.tensor([math.log(10.0)]), torch.tensor([-1.0]), eps_clip=0.2, eps_clip_c=3.0)
    assert loss.item() == pytest.approx(3.0)


# ---- GSPO ------------------------------------------------------------------------------------


def test_gspo_ratio_is_the_geometric_mean_per_sequence_with_per_token_gradient():
    logp = leaf([-1.0, -2.0, -3.0, -0.5])
    old = torch.tensor([-1.5, -2.0, -9.0, -1.0])
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    index = torch.tensor([0, 0, 0, 1])
    log_ratio = gspo_log_ratio(logp, old, mask, index)
    assert log_ratio.tolist() == pytest.approx([0.25, 0.25, 0.25, 0.5])  # masked token 2 ignored
    log_ratio.exp().sum().backward()
    assert logp.grad.tolist() == pytest.approx([math.exp(0.25)] * 3 + [math.exp(0.5)])


def test_gspo_clips_whole_sequences():
    logp = leaf([0.0, 0.0])
    old = torch.tensor([-0.5, 0.3])  # token ratios exp(0.5) and exp(-0.3); sequence ratio exp(0.1)
    config = LossConfig(advantage_estimator="gspo", eps_clip=0.2)
    w = torch.tensor([0.5, 0.5])
    loss, metrics = compute_loss(config, log_probs=logp, loss_mask=torch.ones(2), weight=w, advantages=torch.ones(2),
                                 old_log_probs=old, sample_index=torch.zeros(2, dtype=torch.long))
    loss.backward()
    assert metrics["pg_clipfrac"].item() == 0.0  # token-level PPO would clip token 0
    assert logp.grad.tolist() == pytest.approx([-0.5 * math.exp(0.1)] * 2)


# ---- TIS, SFT, the combined loss -------------------------------------------------------------


def test_tis_weights_are_truncated_and_detached():
    old = leaf([math.log(0.3), math.log(0.1)])
    rollout = torch.tensor([math.log(0.1), math.log(0.2)])
    w = tis_weights(old, rollout, tis_clip=2.0)
    assert w.tolist() == pytest.approx([2.0, 0.5]) and not w.requires_grad


def test_compute_loss_applies_tis_to_the_policy_loss():
    logp = leaf([-1.0, -1.0])
    rollout = torch.tensor([-1.0 - math.log(3.0), -1.0 + math.log(2.0)])  # tis: 3 -> 2.0, 0.5
    config = LossConfig(use_tis=True, tis_clip=2.0)
    loss, metrics = compute_loss(config, log_probs=logp, loss_mask=torch.ones(2), weight=torch.ones(2),
                                 advantages=torch.tensor([1.0, 1.0]), rollout_log_probs=rollout)
    assert loss.item() == pytest.approx(-(2.0 + 0.5))
    assert metrics["tis"].item() == pytest.approx(2.5) and metrics["tis_clipfrac"].item() == 1.0


def test_mis_mask_keeps_the_tokens_whose_ratio_is_in_the_band_and_is_detached():
    # ratios exp(old - rollout) = 3, 1.9, 1, 0.6, 0.4, inf, NaN
    old = leaf([math.log(3.0), math.log(1.9), 0.0, math.log(0.6), math.log(0.4), 0.0, 0.0])
    rollout = torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, -200.0, float("nan")])
    m = mis_mask(old, rollout, low=0.5, high=2.0)
    assert m.tolist() == [0.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0] and not m.requires_grad
    assert mis_mask(old, rollout, low=0.0, high=1.5).tolist() == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 0.0]
    same = torch.zeros(1)  # ratio exactly 1: the band is closed at both ends
    assert mis_mask(same, same, low=1.0, high=2.0).tolist() == mis_mask(same, same, low=0.5, high=1.0).tolist() == [1.0]


def test_compute_loss_with_mis_masks_out_of_band_tokens_and_weights_the_rest_by_the_ratio():
    logp = leaf([-1.0, -1.0, -1.0, -1.0])
    # on-policy (old = logp = -1): ratios exp(-1 - rollout) = 3, 1.5, 0.8, 0.25
    ratios = [3.0, 1.5, 0.8, 0.25]
    rollout = torch.tensor([-1.0 - math.log(r) for r in ratios])
    weight = torch.tensor([0.1, 0.2, 0.3, 0.4])
    advantages = torch.tensor([1.0, 2.0, -1.0, 1.0])
    base = {"log_probs": logp, "loss_mask": torch.tensor([1.0, 1.0, 1.0, 0.0]), "weight": weight,
            "advantages": advantages, "rollout_log_probs": rollout}
    loss, metrics = compute_loss(LossConfig(use_mis=True), **base)  # band [0.5, 2]: keeps 1.5 and 0.8
    # ppo at ratio 1 is -A; masked tokens give 0, kept ones -A * ratio; the 4th is outside loss_mask
    assert loss.item() == pytest.approx(0.2 * -2.0 * 1.5 + 0.3 * 1.0 * 0.8)
    assert metrics["mis_maskfrac"].item() == pytest.approx(0.1)  # token 1 (0.25 is masked out by loss_mask)
    loss.backward()
    assert logp.grad.tolist() == pytest.approx([0.0, -2.0 * 1.5 * 0.2, 1.0 * 0.8 * 0.3, 0.0])

    # with --use-tis too the kept tokens take the truncated ratio: clip(1.5, 0, 1.2) = 1.2
    both = LossConfig(use_mis=True, use_tis=True, tis_clip=1.2)
    loss, metrics = compute_loss(both, **{**base, "log_probs": leaf([-1.0] * 4)})
    assert loss.item() == pytest.approx(0.2 * -2.0 * 1.2 + 0.3 * 1.0 * 0.8)
    assert metrics["tis"].item() == pytest.approx(0.1 * 1.2 + 0.2 * 1.2 + 0.3 * 0.8)
    assert metrics["mis_maskfrac"].item() == pytest.approx(0.1)

    # a wider band keeps token 1 with its full ratio 3
    wide = LossConfig(use_mis=True, mis_low=0.1, mis_high=4.0)
    loss, metrics = compute_loss(wide, **{**base, "log_probs": leaf([-1.0] * 4)})
    assert loss.item() == pytest.approx(0.1 * -1.0 * 3.0 + 0.2 * -2.0 * 1.5 + 0.3 * 1.0 * 0.8)
    assert metrics["mis_maskfrac"].item() == 0.0


def test_on_policy_loss_is_minus_weighted_advantage_and_respects_the_mask():
    logp = leaf([-1.0, -2.0, -3.0])
    loss, metrics = compute_loss(LossConfig(), log_probs=logp, loss_mask=torch.tensor([1.0, 0.0, 1.0]),
                                 weight=torch.tensor([0.25, 0.25, 0.5]), advantages=torch.tensor([2.0, 5.0, -1.0]))
    loss.backward()
    assert loss.item() == pytest.approx(-(0.25 * 2.0 + 0.5 * -1.0))
    assert logp.grad.tolist() == pytest.approx([-0.5, 0.0, 0.5])
    assert metrics["ppo_kl"].item() == 0.0 and metrics["pg_clipfrac"].item() == 0.0


def test_kl_loss_and_entropy_bonus_are_added_per_token():
    logp = leaf([math.log(0.5)])
    config = LossConfig(use_kl_loss=True, kl_loss_coef=0.1, kl_loss_type="k3", entropy_coef=0.01)
    entropy = torch.tensor([2.0])
    loss, metrics = compute_loss(config, log_probs=logp, loss_mask=torch.ones(1), weight=torch.ones(1),
                                 advantages=torch.tensor([1.0]), ref_log_probs=torch.tensor([math.log(0.25)]),
                                 entropy=entropy)
    k3 = 0.5 - 1 + math.log(2)
    assert loss.item() == pytest.approx(-1.0 + 0.1 * k3 - 0.01 * 2.0)
    assert metrics["kl_loss"].item() == pytest.approx(k3) and metrics["entropy"].item() == 2.0


def test_sft_loss_is_weighted_masked_nll():
    logp = leaf([-1.0, -2.0, -4.0])
    loss, metrics = compute_loss(LossConfig(loss_type="sft_loss"), log_probs=logp,
                                 loss_mask=torch.tensor([1.0, 1.0, 0.0]), weight=torch.tensor([0.5, 0.5, 0.5]))
    assert loss.item() == pytest.approx(1.5) and metrics["sft_loss"].item() == pytest.approx(1.5)


def test_missing_inputs_and_bad_flags_name_what_to_pass():
    base = dict(log_probs=torch.zeros(1), loss_mask=torch.ones(1), weight=torch.ones(1), advantages=torch.ones(1))
    with pytest.raises(ConfigError, match="rollout_log_probs"):
        compute_loss(LossConfig(use_tis=True), **base)
    with pytest.raises(ConfigError, match="--use-mis needs rollout_log_probs"):
        compute_loss(LossConfig(use_mis=True), **base)
    for low, high in ((-0.1, 2.0), (2.0, 2.0), (3.0, 2.0)):
        with pytest.raises(ConfigError, match=rf"--mis-low {low} / --mis-high {high}: need 0 <= low < high"):
            LossConfig(use_mis=True, mis_low=low, mis_high=high)
    with pytest.raises(ConfigError, match="ref_log_probs"):
        compute_loss(LossConfig(use_kl_loss=True), **base)
    with pytest.raises(ConfigError, match="sample_index"):
        compute_loss(LossConfig(advantage_estimator="gspo"), **base)
    with pytest.raises(ConfigError, match="--loss-type 'dpo'"):
        LossConfig(loss_type="dpo")


def test_loss_config_from_args_reads_every_field_from_the_flags():
    args = parse_args(["--eps-clip", "0.1", "--eps-clip-high", "0.3", "--use-tis", "--use-mis", "--mis-high", "3.0"])
    config = LossConfig.from_args(args)
    assert (config.eps_clip, config.eps_clip_high, config.use_tis, config.tis_clip) == (0.1, 0.3, True, 2.0)
    assert (config.use_mis, config.mis_low, config.mis_high) == (True, 0.5, 3.0)


def test_loss_config_from_args_names_a_field_args_lacks():
    """A flag renamed without its config field fails at the trainer's start, not by training on a default."""
    args = argparse.Namespace(**{k: v for k, v in vars(parse_args([])).items() if k != "mis_high"})
    with pytest.raises(AttributeError, match=r"LossConfig.from_args: args has no mis_high \(--mis-high\)"):
        LossConfig.from_args(args)
