"""On-policy distillation (OPD): the per-token reverse KL to a teacher, folded into the advantages.

The student samples; a frozen teacher scores the sampled tokens (`Sample.teacher_log_probs`, one
per response token, stored by `vime.rollout.on_policy_distillation`). On every sampled token t

    reverse_kl_t = log pi_student(y_t | y_<t) - log pi_teacher(y_t | y_<t)
    advantage_t  = advantage_t - opd_kl_coef * reverse_kl_t

as slime's `--use-opd`: OPD is a penalty on top of any estimator, so GRPO on a task reward and
distillation combine, and with no task reward (every reward 0) it is pure distillation. Why this
trains the right thing: on-policy, the policy-gradient of `-A_t log pi(y_t)` with
`A_t = -(log pi - log pi_teacher)` is, in expectation over the student's own samples, the gradient
of KL(pi_student || pi_teacher) summed over the response: the mode-seeking divergence that
punishes the student wherever it puts mass the teacher would not.

The student log-prob is the trainer's own, on the weights that sampled (not vLLM's), so the
penalty and the loss's ratio agree; the teacher's is taken as vLLM returned it. Tokens outside
`loss_mask` (tool output, template) get no penalty.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from vime.errors import ConfigError
from vime.train.flag_config import FromFlags
from vime.types import Sample

OPD_TYPES = ("vllm", "sglang")
"""Teacher log-probs scored during the rollout by a teacher server; `sglang` is slime's spelling."""


@dataclass(frozen=True)
class OpdConfig(FromFlags):
    """The OPD flags (slime's names), read from `args` in one place."""

    use_opd: bool = False
    opd_type: str | None = None
    opd_kl_coef: float = 1.0

    def __post_init__(self) -> None:
        if self.opd_kl_coef < 0:
            raise ConfigError(f"--opd-kl-coef must be >= 0 (the weight of the reverse KL), got {self.opd_kl_coef}")
        if self.opd_type is not None and self.opd_type not in OPD_TYPES:
            raise ConfigError(f"--opd-type {self.opd_type!r}: vime scores with a teacher server, choose one of "
                              f"{', '.join(OPD_TYPES)}")


def teacher_log_probs(samples: Sequence[Sample]) -> list[torch.Tensor | None]:
    """Each sample's `teacher_log_probs` as a float32 tensor. A failed sample (FAILED, or an infra
    failure) never reached the reward function that stores them: None, and no penalty. Any other
    sample without them is an error that names it and the hook that should have stored them."""
    out: list[torch.Tensor | None] = []
    for s in samples:
        values = s.teacher_log_probs
        if values is None and (s.status == Sample.Status.FAILED or (s.metadata or {}).get("infra_failure")):
            out.append(None)
            continue
        if values is None:
            raise ConfigError(
                f"--use-opd: sample {s.index} (rollout {s.rollout_id!r}) has no teacher_log_probs; the reward "
                "function stores them: --custom-rm-path vime.rollout.on_policy_distillation.reward_func, or call "
                "vime.rollout.on_policy_distillation.score_with_teacher(args, sample) in your own"
            )
        if len(values) != s.response_length:
            raise ConfigError(f"--use-opd: sample {s.index} has {len(values)} teacher_log_probs for "
                              f"{s.response_length} response tokens")
        out.append(torch.tensor(values, dtype=torch.float32))
    return out


def reverse_kl(student: torch.Tensor, teacher: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
    """Per-token sampled reverse KL, log pi_student - log pi_teacher, 0 where `loss_mask` is 0."""
    if student.shape != teacher.shape or student.shape != loss_mask.shape:
        raise ConfigError(f"OPD: student {tuple(student.shape)}, teacher {tuple(teacher.shape)} and loss_mask "
                          f"{tuple(loss_mask.shape)} log-probs must align, one per response token")
    return (student.float() - teacher.float()) * loss_mask.float()


@dataclass
class OpdResult:
    """The shaped advantages (one tensor per sample) and the step's reverse-KL statistics."""

    advantages: list[torch.Tensor]
    metrics: dict[str, float]


def apply_opd(advantages: Sequence[torch.Tensor], student: Sequence[torch.Tensor],
              teacher: Sequence[torch.Tensor | None], loss_masks: Sequence[torch.Tensor], coef: float) -> OpdResult:
    """`advantage - coef * reverse_kl` per token, and the metrics the run prints; a sample whose
    teacher log-probs are None (a failed one) keeps its advantages and is left out of the metrics.

    `opd_reverse_kl` is the mean over the step's masked tokens (every token counts once, so a
    long response weighs more: it is the per-token KL of what the student wrote);
    `opd_teacher_logprob` the teacher's mean log-prob of those tokens.
    """
    if not len(advantages) == len(student) == len(teacher) == len(loss_masks):
        raise ConfigError(f"OPD: {len(advantages)} advantages, {len(student)} student and {len(teacher)} teacher "
                          f"log-prob tensors, {len(loss_masks)} loss masks: one each per sample")
    shaped, kl_sum, teacher_sum, count = [], 0.0, 0.0, 0.0
    for adv, s, t, m in zip(advantages, student, teacher, loss_masks):
        if t is None:
            shaped.append(adv.float().reshape(-1))
            continue
        mask = m.float().reshape(-1)
        kl = reverse_kl(s.reshape(-1), t.reshape(-1), mask)
        shaped.append(adv.float().reshape(-1) - coef * kl)
        kl_sum += float(kl.sum())
        teacher_sum += float((t.float().reshape(-1) * mask).sum())
        count += float(mask.sum())
    n = max(count, 1.0)
    return OpdResult(shaped, {"opd_reverse_kl": kl_sum / n, "opd_teacher_logprob": teacher_sum / n,
                              "opd_tokens": count})
