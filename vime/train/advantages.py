"""Advantage estimators: GRPO, GSPO, REINFORCE++ and REINFORCE++-baseline (slime's semantics).

The unit of statistics is the *rollout*, not the sample. A rollout is one `generate()` call; a
fan-out returns several sibling samples that share `rollout_id` and `group_index`. Siblings
usually share one reward (an agent's segments, credited with the run's outcome), but may carry
rewards of their own (a multi-agent system whose roles are each scored on their own turn).
Group means and standard deviations count every rollout once, however many siblings it has:
a rollout's siblings share a weight of one, so its value in its group's mean is the mean of its
siblings' rewards (slime counts samples, which biases groups with uneven fan-outs).

Invariants of every estimator here:
- the output holds one float32 tensor of `response_length` per sample, 0 where `loss_mask` is 0;
- rollouts flagged as infra failures are left out of every statistic and get advantage 0;
- a group with fewer than two usable rollouts, or whose rewards are all equal, gets advantage 0
  (never NaN);
- each sample's advantage is its own reward against its group's statistics, so siblings with
  the same reward get the same sequence-level advantage (GRPO, GSPO, REINFORCE++-baseline
  before the KL shaping); when every rollout's siblings agree, the statistics are exactly the
  one-value-per-rollout ones.

The plain function `compute_advantages` works on lists; `advantages_for_samples` adapts a
`list[Sample]` to it, and `advantages_from_config` takes the flags from an `AdvantageConfig`
(built from `args` as `losses.LossConfig` is).
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vime.errors import ConfigError
from vime.train.estimators import ESTIMATORS, GROUP_ESTIMATORS
from vime.train.flag_config import FromFlags
from vime.types import Sample



@dataclass
class Advantages:
    """Per-token advantages, one 1-D float32 tensor per sample (input order), and summary stats."""

    per_token: list[torch.Tensor]
    stats: dict[str, float] = field(default_factory=dict)


@dataclass
class _Rollout:
    rewards: list[float]  # one per sibling, aligned with `samples`
    group: Hashable
    failed: bool
    samples: list[int]

    @property
    def reward(self) -> float:
        """The rollout's value in its group's statistics: the mean of its siblings' rewards."""
        return math.fsum(self.rewards) / len(self.rewards)


def is_infra_failure(flag: Any) -> bool:
    """`True`, or a non-empty cause string, marks an infra failure; `None`/`False`/`""` do not."""
    if isinstance(flag, str):
        return bool(flag.strip())
    return bool(flag)


def collect_rollouts(
    rewards: Sequence[float | None],
    group_ids: Sequence[Hashable],
    rollout_ids: Sequence[Hashable | None],
    infra_failures: Sequence[Any] | None = None,
) -> list[_Rollout]:
    """Collapse samples into rollouts (first-appearance order); a `None` rollout id is its own rollout.

    Siblings must agree on their group: a disagreement means the rollout was assembled wrongly,
    and averaging it away would hide that. A rollout is failed if any sibling is flagged.
    """
    n = len(rewards)
    if len(group_ids) != n or len(rollout_ids) != n:
        raise ConfigError(
            f"advantages: {n} rewards but {len(group_ids)} group ids and {len(rollout_ids)} rollout ids"
        )
    if infra_failures is not None and len(infra_failures) != n:
        raise ConfigError(f"advantages: {n} rewards but {len(infra_failures)} infra_failure flags")
    rollouts: dict[Hashable, _Rollout] = {}
    for i in range(n):
        failed = infra_failures is not None and is_infra_failure(infra_failures[i])
        reward = rewards[i]
        if reward is None and not failed:
            raise ConfigError(
                f"advantages: sample {i} (rollout {rollout_ids[i]!r}) has no reward; score it with the "
                "reward model or flag it as an infra failure"
            )
        key = ("__sample__", i) if rollout_ids[i] is None else rollout_ids[i]
        value = 0.0 if reward is None else float(reward)
        r = rollouts.get(key)
        if r is None:
            rollouts[key] = _Rollout([value], group_ids[i], failed, [i])
            continue
        if r.group != group_ids[i]:
            raise ConfigError(
                f"advantages: rollout {key!r} has siblings in groups {r.group!r} and {group_ids[i]!r}; "
                "siblings of a fan-out must share group_index"
            )
        r.failed = r.failed or failed
        r.rewards.append(value)
        r.samples.append(i)
    return list(rollouts.values())


def group_advantages(
    rollouts: Sequence[_Rollout], *, normalize_std: bool = True, eps: float = 1e-6
) -> tuple[list[list[float]], int]:
    """Per rollout, one scalar per sibling: (r - group mean) / (group std + eps), or r - mean
    without std, where r is the sibling's own reward.

    Every rollout weighs one in its group, split evenly over its siblings: the mean is the mean
    of the rollouts' mean rewards, and the variance is the siblings' squared deviations averaged
    per rollout, summed over rollouts and divided by (rollouts - 1) (Bessel over rollouts, as
    `torch.std` in slime when there is one sample per rollout). Returns the scalars and the
    number of degenerate groups (under two usable rollouts, or zero spread), whose rollouts get 0.
    """
    by_group: dict[Hashable, list[int]] = {}
    for k, r in enumerate(rollouts):
        if not r.failed:
            by_group.setdefault(r.group, []).append(k)
    out = [[0.0] * len(r.rewards) for r in rollouts]
    degenerate = 0
    for members in by_group.values():
        values = [x for k in members for x in rollouts[k].rewards]
        if len(members) < 2 or max(values) == min(values):
            degenerate += 1
            continue
        mean = math.fsum(rollouts[k].reward for k in members) / len(members)
        spread = math.fsum(math.fsum((x - mean) ** 2 for x in rollouts[k].rewards) / len(rollouts[k].rewards)
                           for k in members)
        std = math.sqrt(spread / (len(members) - 1))
        for k in members:
            out[k] = [(x - mean) / (std + eps) if normalize_std else x - mean for x in rollouts[k].rewards]
    return out, degenerate


def discounted_returns(token_rewards: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """G_t = sum_{s>=t} gamma^(s-t) r_s along the last dim (reverse cumulative sum when gamma=1)."""
    if gamma == 1.0:
        return token_rewards.flip(-1).cumsum(-1).flip(-1)
    values = token_rewards.tolist()
    running = 0.0
    for t in range(len(values) - 1, -1, -1):
        running = values[t] + gamma * running
        values[t] = running
    return torch.tensor(values, dtype=token_rewards.dtype)


def masked_whiten(values: list[torch.Tensor], masks: list[torch.Tensor], eps: float = 1e-8) -> list[torch.Tensor]:
    """(x - mean) * rsqrt(var + eps) with mean and (population) var over all masked tokens of all
    tensors together; unmasked tokens become 0. Statistics are in float64."""
    flat = torch.cat([v.double() for v in values]) if values else torch.zeros(0, dtype=torch.float64)
    mask = torch.cat([m.double() for m in masks]) if masks else torch.zeros(0, dtype=torch.float64)
    count = mask.sum()
    if count == 0:
        return [torch.zeros_like(v, dtype=torch.float32) for v in values]
    mean = (flat * mask).sum() / count
    var = (((flat - mean) ** 2) * mask).sum() / count
    scale = torch.rsqrt(var + eps)
    return [((v.double() - mean) * scale * m.double()).float() for v, m in zip(values, masks)]


def compute_advantages(
    estimator: str,
    rewards: Sequence[float | None],
    group_ids: Sequence[Hashable],
    rollout_ids: Sequence[Hashable | None],
    loss_masks: Sequence[torch.Tensor | Sequence[int]],
    *,
    infra_failures: Sequence[Any] | None = None,
    kl: Sequence[torch.Tensor] | None = None,
    kl_coef: float = 0.0,
    normalize_std: bool = True,
    normalize_advantages: bool = False,
    gamma: float = 1.0,
    eps: float = 1e-6,
) -> Advantages:
    """Advantages for one training step's samples; every list argument is per sample, aligned.

    - `grpo` / `gspo`: the rollout's group-normalized reward on every masked token (GSPO differs
      only in the loss, which uses a sequence-level ratio). `normalize_std=False` is slime's
      `--disable-grpo-std-normalization`; the other estimators ignore it. `normalize_advantages`
      (slime's `--normalize-advantages`) then whitens them over all masked tokens of the step.
    - `reinforce_plus_plus`: per token, -kl_coef * kl_t, plus the reward on the last masked token;
      returns are discounted sums (gamma=1 by default), then whitened over all masked tokens.
    - `reinforce_plus_plus_baseline`: (reward - group mean) - kl_coef * kl_t on every masked
      token, then whitened over all masked tokens.

    The REINFORCE++ variants always whiten (`--normalize-advantages` is required for them), so
    `normalize_advantages` changes only GRPO and GSPO.

    `kl` is a per-token KL to the reference (e.g. `losses.kl_divergence(old_logp, ref_logp, ...)`),
    only used by the REINFORCE++ variants. Whitening is over the whole step, so call this once per
    step, before sharding for data-parallel ranks.
    """
    if estimator not in ESTIMATORS:
        raise ConfigError(f"--advantage-estimator {estimator!r} is not one of {', '.join(ESTIMATORS)}")
    masks = [torch.as_tensor(m, dtype=torch.float32).reshape(-1) for m in loss_masks]
    if len(masks) != len(rewards):
        raise ConfigError(f"advantages: {len(rewards)} rewards but {len(masks)} loss masks")
    if kl is not None and len(kl) != len(masks):
        raise ConfigError(f"advantages: {len(masks)} samples but {len(kl)} kl tensors")
    if estimator in GROUP_ESTIMATORS and any(g is None for g in group_ids):
        raise ConfigError(f"--advantage-estimator {estimator} needs a group_index on every sample")
    rollouts = collect_rollouts(rewards, group_ids, rollout_ids, infra_failures)
    failed = [False] * len(masks)
    for r in rollouts:
        for i in r.samples:
            failed[i] = r.failed
    live = [m * (0.0 if f else 1.0) for m, f in zip(masks, failed)]

    scalars, degenerate = (
        group_advantages(rollouts, normalize_std=normalize_std and estimator != "reinforce_plus_plus_baseline", eps=eps)
        if estimator in GROUP_ESTIMATORS
        else ([list(r.rewards) for r in rollouts], 0)
    )
    per_sample_scalar = [0.0] * len(masks)
    for r, per_sibling in zip(rollouts, scalars):
        for i, a in zip(r.samples, per_sibling):
            per_sample_scalar[i] = a

    if estimator in ("grpo", "gspo"):
        per_token = [m * a for m, a in zip(live, per_sample_scalar)]
        if normalize_advantages:
            per_token = masked_whiten(per_token, live)
    else:
        shaped = []
        for i, m in enumerate(live):
            k = torch.zeros_like(m) if kl is None else kl[i].detach().float().reshape(-1) * m
            if k.shape != m.shape:
                raise ConfigError(f"advantages: sample {i} has {m.numel()} mask entries but {k.numel()} kl values")
            token_rewards = -kl_coef * k
            if estimator == "reinforce_plus_plus":
                nz = m.nonzero()
                if len(nz):
                    token_rewards[nz[-1, 0]] += per_sample_scalar[i]
                shaped.append(discounted_returns(token_rewards, gamma) * m)
            else:
                shaped.append((token_rewards + per_sample_scalar[i]) * m)
        per_token = masked_whiten(shaped, live)

    return Advantages(per_token, _stats(rollouts, per_token, live, degenerate, estimator))


def _stats(rollouts: list[_Rollout], per_token: list[torch.Tensor], live: list[torch.Tensor],
           degenerate: int, estimator: str) -> dict[str, float]:
    usable = [r.reward for r in rollouts if not r.failed]
    flat = torch.cat(per_token) if per_token else torch.zeros(0)
    mask = torch.cat(live).bool() if live else torch.zeros(0, dtype=torch.bool)
    values = flat[mask].double()
    stats = {
        "rollouts": float(len(rollouts)),
        "infra_failures": float(len(rollouts) - len(usable)),
        "rewards/mean": math.fsum(usable) / len(usable) if usable else 0.0,
        "advantages/mean": values.mean().item() if values.numel() else 0.0,
        "advantages/std": values.std(unbiased=False).item() if values.numel() else 0.0,
        "advantages/abs_max": values.abs().max().item() if values.numel() else 0.0,
        "tokens": float(values.numel()),
    }
    if estimator in GROUP_ESTIMATORS:
        stats["groups"] = float(len({r.group for r in rollouts if not r.failed}))
        stats["groups/degenerate"] = float(degenerate)
    return stats


def sample_reward(sample: Sample, reward_key: str | None = None) -> float | None:
    """The scalar reward of a sample: `reward`, or `reward[reward_key]` when it is a dict."""
    reward = sample.reward
    if isinstance(reward, dict):
        if reward_key is None or reward_key not in reward:
            raise ConfigError(
                f"sample {sample.index} (rollout {sample.rollout_id!r}) has a dict reward with keys "
                f"{sorted(reward)}; pass --reward-key naming the scalar to train on"
            )
        reward = reward[reward_key]
    return None if reward is None else float(reward)


def advantages_for_samples(
    samples: Sequence[Sample],
    estimator: str,
    *,
    reward_key: str | None = None,
    kl: Sequence[torch.Tensor] | None = None,
    kl_coef: float = 0.0,
    normalize_std: bool = True,
    normalize_advantages: bool = False,
    gamma: float = 1.0,
) -> Advantages:
    """`compute_advantages` over Samples: rewards (optionally `reward[reward_key]`), `group_index`,
    `rollout_id`, `loss_mask` (all ones when unset) and `metadata["infra_failure"]`."""
    masks = [
        torch.ones(s.response_length) if s.loss_mask is None else torch.tensor(s.loss_mask, dtype=torch.float32)
        for s in samples
    ]
    failures = [s.metadata.get("infra_failure") for s in samples]
    rewards = [None if is_infra_failure(f) else sample_reward(s, reward_key) for s, f in zip(samples, failures)]
    return compute_advantages(
        estimator,
        rewards,
        [s.group_index for s in samples],
        [s.rollout_id for s in samples],
        masks,
        infra_failures=failures,
        kl=kl,
        kl_coef=kl_coef,
        normalize_std=normalize_std,
        normalize_advantages=normalize_advantages,
        gamma=gamma,
    )


@dataclass(frozen=True)
class AdvantageConfig(FromFlags):
    """The advantage flags, under slime's attribute names, read from `args` in one place.

    The trainer and the tests both build advantages through this, so a flag wired to the wrong
    attribute shows up as a flag that changes nothing (tests/test_flag_math.py).
    """

    advantage_estimator: str = "grpo"
    disable_grpo_std_normalization: bool = False
    normalize_advantages: bool = False
    kl_coef: float = 0.0
    reward_key: str | None = None

    def __post_init__(self) -> None:
        if self.advantage_estimator not in ESTIMATORS:
            raise ConfigError(
                f"--advantage-estimator {self.advantage_estimator!r} is not one of {', '.join(ESTIMATORS)}"
            )


def advantages_from_config(
    samples: Sequence[Sample], config: AdvantageConfig, *, kl: Sequence[torch.Tensor] | None = None
) -> Advantages:
    """`advantages_for_samples` with the flags of `config`; `kl` is the per-token KL to the reference
    (used by the REINFORCE++ estimators when `config.kl_coef` is set)."""
    return advantages_for_samples(
        samples,
        config.advantage_estimator,
        reward_key=config.reward_key,
        kl=kl,
        kl_coef=config.kl_coef,
        normalize_std=not config.disable_grpo_std_normalization,
        normalize_advantages=config.normalize_advantages,
    )
