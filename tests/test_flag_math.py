"""Every training flag that should change the math changes it.

A flag that parses but is read under another attribute name (or not read at all) trains exactly
like the default, and nothing says so. So each flag here goes through the real path: the command
line through `parse_args`, then `AdvantageConfig.from_args` / `LossConfig.from_args`, then
`advantages_from_config` and `compute_loss` on a packed step, as the trainer runs them. Flipping
the flag from its default must change the advantages (and so the loss) or the loss alone.

The batch has three groups with different rewards and spreads, a fan-out (two siblings of one
rollout), loss masks with holes, and log-probs that disagree: vLLM's (rollout), the trainer's
before the update (old), the trainer's now (current; ratios from about 0.25 to 4) and the
reference's, so clipping, dual-clip, TIS, MIS and every KL estimator have something to act on;
and a teacher's (on-policy distillation), which disagrees with the trainer's on every token.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from vime.config.args import VimeArgs, flag_fields, parse_args
from vime.train.advantages import AdvantageConfig, advantages_from_config
from vime.train.batching import group_rollouts, pack, prepare_step
from vime.train.losses import LossConfig, compute_loss, kl_divergence
from vime.train.opd import OpdConfig, apply_opd, teacher_log_probs
from vime.types import Sample

TRAIN = ["--rollout-batch-size", "3", "--n-samples-per-prompt", "3", "--num-rollout", "1"]

# (group, rollout id, reward, loss mask per sibling): rollout "g0-fan" is a fan-out of two siblings.
ROLLOUTS = [
    (0, "g0-a", 1.0, [[1, 1, 1, 1]]),
    (0, "g0-b", 0.0, [[1, 0, 1]]),
    (0, "g0-fan", 0.0, [[1, 1, 0, 0, 1], [1, 1]]),
    (1, "g1-a", 1.0, [[1, 1, 1]]),
    (1, "g1-b", 0.5, [[0, 1, 1, 1]]),
    (1, "g1-c", 0.2, [[1, 1, 1, 1, 1]]),
    (2, "g2-a", 0.0, [[1, 1, 1]]),
    (2, "g2-b", 2.0, [[1, 1, 1, 0]]),
]


def batch() -> list[Sample]:
    samples = []
    for group, rollout_id, reward, masks in ROLLOUTS:
        for mask in masks:
            k = len(samples)
            n = len(mask)
            samples.append(Sample(
                group_index=group, index=k, rollout_id=rollout_id, prompt="p", tokens=[1, 2, *range(3, 3 + n)],
                response_length=n, reward=reward, loss_mask=mask,
                rollout_log_probs=[-1.0 - 0.1 * ((k + t) % 5) for t in range(n)],
                teacher_log_probs=[-0.5 - 0.3 * ((k + 2 * t) % 7) for t in range(n)],
            ))
    return samples


def _wave(n: int, scale: float, freq: float, phase: float = 0.0) -> torch.Tensor:
    return scale * torch.sin(freq * torch.arange(n, dtype=torch.float32) + phase)


def step(argv: list[str]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """The advantages and the loss of one step on `batch()` under the command line `argv`."""
    args = parse_args([*TRAIN, *argv])
    samples = [s for rollout in group_rollouts(batch()) for s in rollout]
    rollout_lp = torch.tensor([lp for s in samples for lp in s.rollout_log_probs])
    n = rollout_lp.numel()
    old_lp = rollout_lp + _wave(n, 0.9, 2.3)  # trainer vs vLLM: TIS ratios from about 0.4 to 2.5
    log_probs = old_lp + _wave(n, 1.4, 1.7, 0.5)  # after updates: PPO ratios from about 0.25 to 4
    ref_lp = old_lp + _wave(n, 0.6, 0.9, 1.0)
    entropy = 1.0 + _wave(n, 0.5, 1.3)

    lengths = [s.response_length for s in samples]
    kl = None
    if args.kl_coef > 0:  # as the trainer: the reward-shaping KL of the policy that sampled
        kl = [kl_divergence(o, r, "k1") for o, r in zip(old_lp.split(lengths), ref_lp.split(lengths))]
    advantages = advantages_from_config(samples, AdvantageConfig.from_args(args), kl=kl).per_token
    if OpdConfig.from_args(args).use_opd:  # as the trainer: the reverse KL of the policy that sampled
        masks = [torch.tensor(s.loss_mask, dtype=torch.float32) for s in samples]
        advantages = apply_opd(advantages, list(old_lp.split(lengths)), teacher_log_probs(samples), masks,
                               args.opd_kl_coef).advantages

    config = LossConfig.from_args(args)
    packed = pack(prepare_step(group_rollouts(samples), advantages))
    assert torch.equal(packed.rollout_log_probs, rollout_lp)
    loss, _ = compute_loss(
        config, log_probs=log_probs, loss_mask=packed.loss_mask, weight=packed.weights,
        advantages=packed.advantages, old_log_probs=old_lp, ref_log_probs=ref_lp,
        rollout_log_probs=packed.rollout_log_probs, entropy=entropy if config.entropy_coef else None,
        sample_index=packed.sample_index,
    )
    return advantages, loss


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.allclose(x, y, atol=1e-6) for x, y in zip(a, b, strict=True))


ADVANTAGES, LOSS = "advantages", "loss"
NORMALIZED = ["--normalize-advantages"]
KL_LOSS = ["--use-kl-loss", "--kl-loss-coef", "0.1"]

# (flag, the command line it is flipped against, the flipped value's tokens, what must change)
FLAGS = [
    ("--advantage-estimator=gspo", [], ["--advantage-estimator", "gspo"], LOSS),
    ("--advantage-estimator=reinforce_plus_plus", NORMALIZED, ["--advantage-estimator", "reinforce_plus_plus"],
     ADVANTAGES),
    ("--advantage-estimator=reinforce_plus_plus_baseline", NORMALIZED,
     ["--advantage-estimator", "reinforce_plus_plus_baseline"], ADVANTAGES),
    ("--normalize-advantages", [], ["--normalize-advantages"], ADVANTAGES),
    ("--disable-grpo-std-normalization", [], ["--disable-grpo-std-normalization"], ADVANTAGES),
    ("--eps-clip", [], ["--eps-clip", "0.1"], LOSS),
    ("--eps-clip-high", [], ["--eps-clip-high", "0.28"], LOSS),
    ("--eps-clip-c", [], ["--eps-clip-c", "3"], LOSS),
    ("--kl-coef(reinforce_plus_plus)", [*NORMALIZED, "--advantage-estimator", "reinforce_plus_plus"],
     ["--kl-coef", "0.5"], ADVANTAGES),
    ("--kl-coef(reinforce_plus_plus_baseline)", [*NORMALIZED, "--advantage-estimator", "reinforce_plus_plus_baseline"],
     ["--kl-coef", "0.5"], ADVANTAGES),
    ("--use-kl-loss/--kl-loss-coef", [], KL_LOSS, LOSS),
    ("--kl-loss-type=k2", KL_LOSS, ["--kl-loss-type", "k2"], LOSS),
    ("--kl-loss-type=k3", KL_LOSS, ["--kl-loss-type", "k3"], LOSS),
    ("--kl-loss-type=low_var_kl", KL_LOSS, ["--kl-loss-type", "low_var_kl"], LOSS),
    ("--entropy-coef", [], ["--entropy-coef", "0.01"], LOSS),
    ("--use-tis", [], ["--use-tis"], LOSS),
    ("--tis-clip", ["--use-tis"], ["--tis-clip", "1.2"], LOSS),
    ("--tis-clip-low", ["--use-tis"], ["--tis-clip-low", "0.8"], LOSS),
    ("--use-mis", [], ["--use-mis"], LOSS),
    ("--use-mis(with --use-tis)", ["--use-tis"], ["--use-mis"], LOSS),
    ("--mis-low", ["--use-mis"], ["--mis-low", "0.8"], LOSS),
    ("--mis-high", ["--use-mis"], ["--mis-high", "1.5"], LOSS),
    ("--loss-type=sft_loss", [], ["--loss-type", "sft_loss"], LOSS),
    ("--use-opd", [], ["--use-opd"], ADVANTAGES),
    ("--opd-kl-coef", ["--use-opd"], ["--opd-kl-coef", "0.3"], ADVANTAGES),
]


@pytest.mark.parametrize(("flag", "base", "flipped", "changes"), FLAGS, ids=[row[0] for row in FLAGS])
def test_flipping_a_training_flag_changes_the_advantages_or_the_loss(flag, base, flipped, changes):
    base_adv, base_loss = step(base)
    adv, loss = step([*base, *flipped])
    assert torch.isfinite(loss) and torch.isfinite(base_loss)
    assert not math.isclose(loss.item(), base_loss.item(), rel_tol=1e-6, abs_tol=1e-7), f"{flag} left the loss as is"
    if changes == ADVANTAGES:
        assert not same(adv, base_adv), f"{flag} left the advantages as they were"
    else:
        assert same(adv, base_adv), f"{flag} is a loss flag but changed the advantages"


def test_every_algorithm_flag_has_a_row_in_the_table():
    algorithm = {"--" + f.name.replace("_", "-") for f in flag_fields() if f.metadata["group"] == "algorithm"}
    covered = {token for _, base, flipped, _ in FLAGS for token in [*base, *flipped] if token.startswith("--")}
    assert algorithm <= covered, f"add a row for {sorted(algorithm - covered)}"


@pytest.mark.parametrize("config", [LossConfig, AdvantageConfig, OpdConfig])
def test_every_field_of_the_loss_and_advantage_configs_is_a_flag(config):
    """`from_args` skips what `args` lacks, so a config field without a flag would silently keep its default."""
    flags = {f.name for f in flag_fields()}
    assert {f.name for f in dataclasses.fields(config)} <= flags
    assert set(dataclasses.asdict(config.from_args(parse_args([])))) <= set(vars(VimeArgs()))


def test_the_default_step_trains_on_every_group():
    """The baseline the table compares against is not degenerate: every group has nonzero advantages."""
    advantages, loss = step([])
    samples = [s for rollout in group_rollouts(batch()) for s in rollout]
    for group in {s.group_index for s in samples}:
        assert any(a.abs().sum() > 0 for a, s in zip(advantages, samples) if s.group_index == group)
    assert loss.item() != 0.0
