"""Per-token losses of the trainer: PPO-clip (with clip-higher and GSPO's sequence ratio), KL to
the reference, entropy bonus, truncated and masked importance sampling (TIS, MIS) and SFT.

Every tensor here is flat and 1-D over the response tokens of a packed micro-batch
(`batching.PackedBatch`), aligned with `loss_mask` and a per-token `weight`. The loss of a
micro-batch is `sum(weight * per_token_loss * loss_mask)`: `batching.loss_weights` chooses the
weights so that summing micro-batches (and data-parallel ranks) gives the step loss, the mean over
rollouts of each rollout's token mean. Metrics are weighted the same way, so they add up too.

`token_logprobs` and `entropy_from_logits` are custom autograd functions: they keep only the
logits (already alive) and one float per token for backward, and recompute softmax in row chunks,
instead of saving a float32 copy of the [tokens, vocab] log-softmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vime.errors import ConfigError
from vime.train.flag_config import FromFlags

KL_TYPES = ("k1", "k2", "k3", "low_var_kl")
LOSS_TYPES = ("policy_loss", "sft_loss")


@dataclass(frozen=True)
class LossConfig(FromFlags):
    """The loss flags (slime's names). `eps_clip_high=None` means symmetric clipping;
    `eps_clip_c` enables dual-clip for negative advantages (slime's `--eps-clip-c`)."""

    loss_type: str = "policy_loss"
    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    entropy_coef: float = 0.0
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    use_mis: bool = False
    mis_low: float = 0.5
    mis_high: float = 2.0

    def __post_init__(self) -> None:
        if self.loss_type not in LOSS_TYPES:
            raise ConfigError(f"--loss-type {self.loss_type!r} is not one of {', '.join(LOSS_TYPES)}")
        if self.kl_loss_type not in KL_TYPES:
            raise ConfigError(f"--kl-loss-type {self.kl_loss_type!r} is not one of {', '.join(KL_TYPES)}")
        if self.eps_clip < 0 or (self.eps_clip_high is not None and self.eps_clip_high < 0):
            raise ConfigError(f"--eps-clip {self.eps_clip} / --eps-clip-high {self.eps_clip_high} must be >= 0")
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ConfigError(f"--eps-clip-c {self.eps_clip_c} must be > 1 (dual-clip lower bound)")
        if self.tis_clip <= 0 or not 0 <= self.tis_clip_low <= self.tis_clip:
            raise ConfigError(
                f"--tis-clip-low {self.tis_clip_low} / --tis-clip {self.tis_clip}: need 0 <= low <= high and high > 0"
            )
        if not 0 <= self.mis_low < self.mis_high:
            raise ConfigError(
                f"--mis-low {self.mis_low} / --mis-high {self.mis_high}: need 0 <= low < high (tokens whose "
                "rollout ratio leaves [low, high] are masked)"
            )


# ---- log-probs and entropy from logits -------------------------------------------------------


def _chunks(n: int, size: int) -> range:
    return range(0, n, max(1, size))


def _compute_dtype(logits: torch.Tensor) -> torch.dtype:
    """float32 for bf16/fp16/fp32 logits; float64 stays float64 (for gradcheck)."""
    return torch.promote_types(logits.dtype, torch.float32)


class _TokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, temperature, chunk_size):
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        for s in _chunks(logits.shape[0], chunk_size):
            rows = slice(s, s + chunk_size)
            z = logits[rows].to(dtype) / temperature
            lse[rows] = torch.logsumexp(z, dim=-1)
            out[rows] = z.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, targets, lse = ctx.saved_tensors
        t, size = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        for s in _chunks(logits.shape[0], size):
            p = torch.exp(logits[s : s + size].to(lse.dtype) / t - lse[s : s + size, None])
            p.scatter_add_(-1, targets[s : s + size, None], -torch.ones_like(p[:, :1]))
            grad[s : s + size] = (p * (-grad_out[s : s + size, None] / t)).to(logits.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096
) -> torch.Tensor:
    """log_softmax(logits / temperature)[targets] for logits [..., vocab], targets [...]; float32
    (float64 for float64 logits).

    Pass only the rows that predict response tokens (`logits[0, packed.logit_index]`), not the
    whole packed row. Memory: backward keeps the logits and one float per row.
    """
    if temperature <= 0:
        raise ConfigError(f"token_logprobs: temperature must be > 0, got {temperature}")
    shape = targets.shape
    rows = logits.reshape(-1, logits.shape[-1])
    flat = _TokenLogProbs.apply(rows, targets.reshape(-1).long(), temperature, chunk_size)
    return flat.reshape(shape)


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, temperature, chunk_size):
        out = torch.empty(logits.shape[0], dtype=_compute_dtype(logits), device=logits.device)
        for s in _chunks(logits.shape[0], chunk_size):
            logp = torch.log_softmax(logits[s : s + chunk_size].to(out.dtype) / temperature, dim=-1)
            out[s : s + chunk_size] = -(logp.exp() * logp).sum(-1)
        ctx.save_for_backward(logits, out)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):
        logits, entropy = ctx.saved_tensors
        t, size = ctx.temperature, ctx.chunk_size
        grad = torch.empty_like(logits)
        for s in _chunks(logits.shape[0], size):
            logp = torch.log_softmax(logits[s : s + size].to(entropy.dtype) / t, dim=-1)
            # dH/dz_j = -p_j (log p_j + H)
            g = -logp.exp() * (logp + entropy[s : s + size, None])
            grad[s : s + size] = (g * (grad_out[s : s + size, None] / t)).to(logits.dtype)
        return grad, None, None


def entropy_from_logits(logits: torch.Tensor, temperature: float = 1.0, chunk_size: int = 4096) -> torch.Tensor:
    """Per-row entropy of softmax(logits / temperature), shape logits.shape[:-1]; float32
    (float64 for float64 logits)."""
    if temperature <= 0:
        raise ConfigError(f"entropy_from_logits: temperature must be > 0, got {temperature}")
    flat = _Entropy.apply(logits.reshape(-1, logits.shape[-1]), temperature, chunk_size)
    return flat.reshape(logits.shape[:-1])


# ---- per-token terms -------------------------------------------------------------------------


def kl_divergence(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kl_type: str = "k1") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) from the sampled token's log-probs (Schulman's k1-k3).

    k1 = log r, k2 = (log r)^2 / 2, k3 = exp(-log r) - 1 + log r with log r = logp - ref_logp.
    `low_var_kl` is k3 with log r clamped to [-20, 20] and the result to [-10, 10] (verl's form),
    which keeps rare huge ratios from dominating the gradient.
    """
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return 0.5 * log_ratio.square()
    if kl_type == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    if kl_type == "low_var_kl":
        lr = log_ratio.clamp(-20, 20)
        return (torch.exp(-lr) - 1 + lr).clamp(-10, 10)
    raise ConfigError(f"--kl-loss-type {kl_type!r} is not one of {', '.join(KL_TYPES)}")


def gspo_log_ratio(
    log_probs: torch.Tensor, old_log_probs: torch.Tensor, loss_mask: torch.Tensor, sample_index: torch.Tensor
) -> torch.Tensor:
    """GSPO-token log-ratio: its value on every token of sample i is the sequence log-ratio
    mean_t(logp - old_logp) over i's masked tokens, and its gradient is d logp_t (the detach
    trick of the GSPO paper). With per-token weights 1/n_i this gives exactly GSPO's sequence
    gradient ratio_i * grad mean_t logp_t; clipping then acts per sequence."""
    mask = loss_mask.float()
    n = int(sample_index.max().item()) + 1 if sample_index.numel() else 0
    diff = (log_probs.detach().float() - old_log_probs.float()) * mask
    sums = torch.zeros(n, dtype=torch.float32, device=diff.device).index_add_(0, sample_index, diff)
    counts = torch.zeros(n, dtype=torch.float32, device=diff.device).index_add_(0, sample_index, mask)
    seq = sums / counts.clamp(min=1.0)
    return seq[sample_index] + log_probs.float() - log_probs.detach().float()


def ppo_clip_loss(
    log_ratio: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high)) and a 0/1 "clipped" tensor.

    Clip-higher (eps_clip_high > eps_clip) leaves low-probability tokens room to grow. Where the
    clipped term wins the loss is constant in r, so its gradient is 0. Dual-clip (eps_clip_c)
    bounds the loss of negative advantages by -A * eps_clip_c.
    """
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1 - eps_clip, 1 + high)
    loss = torch.maximum(unclipped, clipped)
    clip_flag = (clipped > unclipped).float()
    if eps_clip_c is not None:
        bound = -advantages * eps_clip_c
        loss = torch.where(advantages < 0, torch.minimum(loss, bound), loss)
    return loss, clip_flag


def tis_weights(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, tis_clip: float = 2.0, tis_clip_low: float = 0.0
) -> torch.Tensor:
    """Truncated importance sampling: clip(pi_trainer / pi_vllm, low, C), detached.

    Corrects for vLLM's sampler and the trainer disagreeing on the same weights; truncation at
    C = --tis-clip bounds the variance, and --tis-clip-low (slime's, default 0: off) keeps a
    token the trainer finds much less likely than vLLM did from vanishing from the gradient.
    """
    ratio = torch.exp(old_log_probs.detach().float() - rollout_log_probs.float())
    return ratio.clamp(min=tis_clip_low, max=tis_clip).detach()


def mis_mask(
    old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, low: float = 0.5, high: float = 2.0
) -> torch.Tensor:
    """Masked importance sampling: 1.0 where pi_trainer / pi_vllm lies in [low, high], else 0.0; detached.

    Where TIS bounds a far-off token's weight, MIS drops the token from the policy loss: a ratio
    far from 1 means the stored rollout logprob no longer describes the trainer's policy (a
    sampler/trainer mismatch, or a partial rollout whose earlier tokens came from older
    weights), and such a token's gradient is mostly noise. A NaN or infinite ratio is masked.
    TIS and MIS together are what slime calls rollout correction (verl: rollout importance
    sampling); both read the logprobs stored with the rollout, never a recomputation.
    """
    ratio = torch.exp(old_log_probs.detach().float() - rollout_log_probs.float())
    return ((ratio >= low) & (ratio <= high)).float().detach()


def sft_loss(log_probs: torch.Tensor) -> torch.Tensor:
    """Per-token negative log-likelihood."""
    return -log_probs.float()


# ---- the loss of a micro-batch ---------------------------------------------------------------


def _wsum(x: torch.Tensor, wm: torch.Tensor) -> torch.Tensor:
    return (x.float() * wm).sum()


def compute_loss(
    config: LossConfig,
    *,
    log_probs: torch.Tensor,
    loss_mask: torch.Tensor,
    weight: torch.Tensor,
    advantages: torch.Tensor | None = None,
    old_log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    sample_index: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch loss `sum(weight * per_token_loss * loss_mask)` and its metrics.

    Policy loss per token: ppo_clip(ratio) * is_weight + kl_loss_coef * kl(logp, ref) - entropy_coef * H.
    - `old_log_probs`: the trainer's log-probs before this update; `None` means on-policy (the
      step's first update): `log_probs.detach()`, ratio 1.
    - `advantage_estimator == "gspo"` uses the sequence ratio and needs `sample_index`.
    - `is_weight` corrects for the rollout policy (vLLM, or older weights for the tokens of a
      partial rollout) not being the trainer's: with `use_tis` the truncated ratio
      `tis_weights`; with `use_mis` the tokens `mis_mask` rejects get 0 and the others the
      ratio itself (truncated too when `use_tis` is also on); else 1. Both need
      `rollout_log_probs`. `use_kl_loss` needs `ref_log_probs`; `entropy_coef` needs
      `entropy` (from `entropy_from_logits`, with its gradient).

    Metrics are detached weighted sums (same weights as the loss): summed over micro-batches and
    ranks they give the step's mean over rollouts.
    """
    wm = weight.float() * loss_mask.float()
    metrics: dict[str, torch.Tensor] = {}
    if config.loss_type == "sft_loss":
        loss = _wsum(sft_loss(log_probs), wm)
        metrics["sft_loss"] = loss.detach()
        metrics["loss"] = loss.detach()
        return loss, metrics

    if advantages is None:
        raise ConfigError("compute_loss: --loss-type policy_loss needs advantages")
    old = log_probs.detach() if old_log_probs is None else old_log_probs
    if config.advantage_estimator == "gspo":
        if sample_index is None:
            raise ConfigError("compute_loss: --advantage-estimator gspo needs sample_index (PackedBatch.sample_index)")
        log_ratio = gspo_log_ratio(log_probs, old, loss_mask, sample_index)
    else:
        log_ratio = log_probs.float() - old.float()
    pg, clip_flag = ppo_clip_loss(
        log_ratio, advantages.float(), config.eps_clip, config.eps_clip_high, config.eps_clip_c
    )
    metrics["pg_clipfrac"] = _wsum(clip_flag, wm).detach()
    metrics["ppo_kl"] = _wsum(old.float() - log_probs.detach().float(), wm)
    for flag, on in (("--use-tis", config.use_tis), ("--use-mis", config.use_mis)):
        if on and rollout_log_probs is None:
            raise ConfigError(f"compute_loss: {flag} needs rollout_log_probs (vLLM's logprobs)")
    if config.use_tis:
        tis = tis_weights(old, rollout_log_probs, config.tis_clip, config.tis_clip_low)
        metrics["tis"] = _wsum(tis, wm)
        clipped = (tis >= config.tis_clip) | ((tis <= config.tis_clip_low) & (config.tis_clip_low > 0))
        metrics["tis_clipfrac"] = _wsum(clipped.float(), wm)
    if config.use_mis:
        keep = mis_mask(old, rollout_log_probs, config.mis_low, config.mis_high)
        ratio = tis if config.use_tis else torch.exp(old.detach().float() - rollout_log_probs.float())
        pg = pg * torch.where(keep > 0, ratio, torch.zeros_like(ratio))  # inf outside the band: 0, not NaN
        metrics["mis_maskfrac"] = _wsum(1.0 - keep, wm)
    elif config.use_tis:
        pg = pg * tis
    per_token = pg
    metrics["pg_loss"] = _wsum(pg.detach(), wm)
    if config.use_kl_loss:
        if ref_log_probs is None:
            raise ConfigError("compute_loss: --use-kl-loss needs ref_log_probs from the reference model")
        kl = kl_divergence(log_probs, ref_log_probs, config.kl_loss_type)
        per_token = per_token + config.kl_loss_coef * kl
        metrics["kl_loss"] = _wsum(kl.detach(), wm)
    if config.entropy_coef != 0.0:
        if entropy is None:
            raise ConfigError("compute_loss: --entropy-coef needs entropy (losses.entropy_from_logits)")
        per_token = per_token - config.entropy_coef * entropy.float()
    if entropy is not None:
        metrics["entropy"] = _wsum(entropy.detach(), wm)
    loss = _wsum(per_token, wm)
    metrics["loss"] = loss
    return loss, {k: v.detach() for k, v in metrics.items()}
