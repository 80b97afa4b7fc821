"""The trainer: an HF causal LM (under FSDP2 on more than one rank), one `train_step` per rollout batch.

One `Trainer` lives in each rank of a trainer process group (see `distributed.py`); every
method here is collective: all ranks call it with the same arguments, in the same order.

A rollout batch (the rollouts of one rollout step) becomes one or more optimizer steps of
`--global-batch-size` rollouts each (siblings never split). Advantages are computed over the
whole batch first (GRPO needs whole groups); each rollout then contributes one token-weighted
mean to its optimizer step's loss (`batching.loss_weights`), so the loss does not depend on
how samples fall into micro-batches or ranks.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.distributed.fsdp import fully_shard

from vime.train import distributed as dist_utils
from vime.train.advantages import AdvantageConfig, Advantages, advantages_from_config
from vime.train.batching import TrainSample, group_rollouts, pack, plan_micro_batches, prepare_step, split_into_steps
from vime.train.forward import response_logits
from vime.train.lora import ADAPTER_NAME, LoraConfig, adapter_weights, decoder_layers, is_adapter_key, merged_weights
from vime.train.lora import wrap as lora_wrap
from vime.train.losses import LossConfig, compute_loss, entropy_from_logits, kl_divergence, token_logprobs
from vime.train.opd import OpdConfig, apply_opd, teacher_log_probs
from vime.types import Sample

DEFAULT_TOKEN_BUDGET = {"cuda": 8192, "cpu": 1024}


def default_token_budget(device: torch.device) -> int:
    """The packed micro-batch's token budget when --max-tokens-per-gpu is not given.

    Packed samples attend block-diagonally within one row; on CPU that attention costs the
    square of the row's length, so one ~4,500-token row per step made a quickstart step (64
    samples of ~56 tokens) take 0.95 s where 1,024-token rows take 0.53 s (512: 0.54, 2,048:
    0.70). On GPUs the kernels skip the masked blocks and larger rows fill the device better.
    """
    return DEFAULT_TOKEN_BUDGET.get(device.type, DEFAULT_TOKEN_BUDGET["cuda"])


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float] = field(default_factory=dict)


def lr_lambda(args: Any, total_steps: int):
    """LR multiplier per optimizer step: linear warmup, then constant / linear / cosine to min_lr."""
    warmup = args.lr_warmup_iters or 0
    floor = (args.min_lr / args.lr) if args.lr else 0.0

    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        if args.lr_decay_style == "constant" or total_steps <= warmup:
            return 1.0
        progress = min(1.0, (step - warmup) / max(1, total_steps - warmup))
        if args.lr_decay_style == "linear":
            return floor + (1 - floor) * (1 - progress)
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


def policy_dtype(device: torch.device) -> torch.dtype:
    """The trainer's weights: bf16 on GPUs, fp32 on CPU (where the servers' logprobs are compared to 1e-3)."""
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def load_causal_lm(path: str, device: torch.device, dtype: torch.dtype, *, trainable: bool,
                   gradient_checkpointing: bool = False, lora: LoraConfig | None = None,
                   shard: bool = True) -> torch.nn.Module:
    """Load an HF causal LM; with `shard`, shard it with FSDP2: each decoder layer, then the root.
    With `lora` enabled the model is wrapped by peft first (only the adapter requires grad)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa").to(device)
    if gradient_checkpointing and trainable:
        model.gradient_checkpointing_enable()
        if lora is not None and lora.enabled:
            model.enable_input_require_grads()  # frozen embeddings: checkpointed layers still need a graph
    if lora is not None and lora.enabled:
        model = lora_wrap(model, lora)
    if shard:
        for layer in decoder_layers(model):
            fully_shard(layer)
        fully_shard(model)
    model.train(trainable)
    if not trainable:
        model.requires_grad_(False)
    return model


PART_APPLIED = -1
"""`Trainer.step` after a step that raised part-way (with several optimizer steps per rollout
step, the first may have gone in): the weights are no step's, so a re-attach reloads them."""

class Trainer:
    """Policy, optional frozen reference, AdamW and the LR schedule, on this rank.

    The models are sharded with FSDP2 only on more than one rank: at world size 1 there is no
    shard to gather, so the wrapper's hooks are pure cost, and the update is the same without them
    (bit for bit on CPU; `tests/test_lean_train.py` holds it to 1e-6). `shard=True` keeps the
    wrapper at world size 1, for that comparison.
    """

    def __init__(self, args: Any, model_path: str | None = None, *, shard: bool | None = None,
                 base: Any = None, adapter: str = ADAPTER_NAME) -> None:
        """`base`: a long-lived trainer's `SharedBase` (`vime.train.tenants`): this run trains
        its own adapter, named `adapter`, on it, and its reference policy is the base itself (the
        adapter switched off: the same weights a separately loaded reference would hold)."""
        self.args = args
        self.device = dist_utils.init_distributed()
        self.dtype = policy_dtype(self.device)
        self.model_path = model_path or args.hf_checkpoint
        self.sharded = dist_utils.world_size() > 1 if shard is None else shard
        self.lora = LoraConfig.from_args(args)
        self.adapter = adapter
        self.base = base
        needs_ref = args.use_kl_loss or args.kl_coef > 0
        if base is not None:
            self.model = base.add_adapter(adapter, self.lora, seed=args.seed)
            self.ref_model = self.model if needs_ref else None
        else:
            torch.manual_seed(args.seed)
            self.model = load_causal_lm(self.model_path, self.device, self.dtype, trainable=True,
                                        gradient_checkpointing=args.gradient_checkpointing, lora=self.lora,
                                        shard=self.sharded)
            self.ref_model = (load_causal_lm(args.ref_load or args.hf_checkpoint, self.device,
                                             self.dtype, trainable=False, shard=self.sharded) if needs_ref else None)
        self.optimizer = torch.optim.AdamW(self.trainable_parameters(), lr=args.lr, betas=(args.adam_beta1, args.adam_beta2),
                                           weight_decay=args.weight_decay)
        total = (args.num_rollout or 1000) * max(1, self._optimizer_steps_per_rollout())
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lr_lambda(args, total))
        self.loss_config = LossConfig.from_args(args)
        self.advantage_config = AdvantageConfig.from_args(args)
        self.opd_config = OpdConfig.from_args(args)
        self.temperature = args.rollout_temperature
        self.budget = args.max_tokens_per_gpu or default_token_budget(self.device)
        self.step = 0  # rollout steps applied to these weights (PART_APPLIED: a step failed part-way)

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        """What the optimizer updates: every weight, or with LoRA the adapter's only (on a shared
        base, this run's adapter's, whichever adapter is active now)."""
        if self.base is not None:
            return [p for n, p in self.model.named_parameters() if is_adapter_key(n, self.adapter)]
        return [p for p in self.model.parameters() if p.requires_grad]

    def _optimizer_steps_per_rollout(self) -> int:
        a = self.args
        if not a.rollout_batch_size or not a.global_batch_size:
            return 1
        return max(1, a.rollout_batch_size * a.n_samples_per_prompt // a.global_batch_size)

    # ---- forward passes ----------------------------------------------------------------------

    def _forward(self, model: torch.nn.Module, micro_batch: list, *, entropy: bool = False):
        """Response-token logprobs (and entropy) of a packed micro-batch. The entropy carries its
        gradient only for an entropy bonus (`--entropy-coef`); otherwise it is the step's `entropy`
        metric, taken from the logits already there without a graph."""
        if not micro_batch:  # padding micro-batch (ranks must run the same count): a dummy forward
            out = model(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device), use_cache=False)
            return None, out.logits.sum() * 0.0, None
        packed = pack(micro_batch).to(self.device)
        logits = response_logits(model, packed)
        lp = token_logprobs(logits, packed.targets, self.temperature)
        ent = None
        if entropy:
            ent = (entropy_from_logits(logits, self.temperature) if self.loss_config.entropy_coef != 0
                   else entropy_from_logits(logits.detach(), self.temperature))
        return packed, lp, ent

    @torch.no_grad()
    def _logprobs_of(self, model: torch.nn.Module, plan: list[list[list]], *,
                     reference: bool = False) -> dict[int, torch.Tensor]:
        """Per-sample logprobs (keyed by id of the Sample) over this rank's share of `plan`; with
        `reference` on a shared base, the base's (the adapters switched off)."""
        if reference and self.base is not None:
            with model.disable_adapter():
                return self._logprobs_of(model, plan)
        out: dict[int, torch.Tensor] = {}
        for step_plan in plan:
            for mb in step_plan[dist_utils.rank()]:
                packed, lp, _ = self._forward(model, mb)
                if packed is None:
                    continue
                for item, piece in zip(mb, packed.split(lp.float().cpu())):
                    out[id(item.sample if isinstance(item, TrainSample) else item)] = piece
        return out

    # ---- one rollout step --------------------------------------------------------------------

    def train_step(self, samples: list[Sample]) -> StepResult:
        """Train on one rollout batch; returns the step's metrics (identical on every rank)."""
        t0 = time.monotonic()
        args, world = self.args, dist_utils.world_size()
        # A sample with no prompt or no response (an infra failure before the first token) has
        # nothing to train on and no position to pack; its rollout keeps its other siblings.
        samples = [s for s in samples if s.response_length > 0 and s.prompt_length > 0]
        rollouts = group_rollouts(samples)
        per_step = args.global_batch_size or len(rollouts)
        steps, rest = split_into_steps(rollouts, per_step)
        steps = steps + ([rest] if rest else [])
        flat = [s for step in steps for r in step for s in r]

        # Plans are computed once, deterministically, so every pass below sees the same layout.
        zero_adv = [torch.zeros(s.response_length) for s in flat]
        offsets = [0]
        for step in steps:
            offsets.append(offsets[-1] + sum(len(r) for r in step))
        shells = [prepare_step(step, zero_adv[offsets[i]:offsets[i + 1]]) for i, step in enumerate(steps)]
        plan = [plan_micro_batches(items, world, self.budget) for items in shells]
        t_batched = time.monotonic()

        ref_lp = self._logprobs_of(self.ref_model, plan, reference=True) if self.ref_model is not None else {}
        old_lp = self._logprobs_of(self.model, plan) if len(steps) > 1 else {}
        t_logprobs = time.monotonic()
        kl = None
        if args.kl_coef > 0 and ref_lp:
            kl = [kl_divergence(old_lp.get(id(s), torch.tensor(s.rollout_log_probs)), ref_lp[id(s)], "k1")
                  if id(s) in ref_lp else torch.zeros(s.response_length) for s in flat]
        if self.loss_config.loss_type == "sft_loss":  # SFT traces carry no rewards; the loss ignores advantages
            adv = Advantages([torch.zeros(s.response_length) for s in flat])
        else:
            adv = advantages_from_config(flat, self.advantage_config, kl=kl)
        opd_metrics = {}
        if self.opd_config.use_opd and self.loss_config.loss_type != "sft_loss":
            adv, opd_metrics = self._apply_opd(flat, adv, old_lp or self._logprobs_of(self.model, plan))
        by_id = {id(s): a for s, a in zip(flat, adv.per_token)}
        t_advantages = time.monotonic()
        optimizer_seconds = 0.0
        for items in shells:
            for item in items:
                item.advantages = by_id[id(item.sample)].float().reshape(-1)

        sums: dict[str, float] = {}
        grad_norms = []
        for i, step_plan in enumerate(plan):
            for mb in step_plan[dist_utils.rank()]:
                packed, lp, ent = self._forward(self.model, mb, entropy=self.loss_config.loss_type != "sft_loss")
                if packed is None:
                    (lp * world).backward()
                    continue
                def gather(d: dict[int, torch.Tensor], mb=mb) -> torch.Tensor:
                    return torch.cat([d[id(x.sample)] for x in mb]).to(self.device)

                loss, metrics = compute_loss(
                    self.loss_config, log_probs=lp, loss_mask=packed.loss_mask, weight=packed.weights,
                    advantages=packed.advantages,
                    old_log_probs=gather(old_lp) if old_lp else None,
                    ref_log_probs=gather(ref_lp) if ref_lp else None,
                    rollout_log_probs=packed.rollout_log_probs, entropy=ent, sample_index=packed.sample_index,
                )
                (loss * world).backward()  # FSDP averages gradients over ranks; the weights are global
                wm = packed.weights * packed.loss_mask
                if i == 0 and packed.rollout_log_probs is not None:
                    metrics["train_rollout_logprob_abs_diff"] = (
                        (lp.detach() - packed.rollout_log_probs).abs() * wm).sum()
                if ref_lp and "kl_loss" not in metrics:
                    metrics["ref_kl"] = (kl_divergence(lp.detach(), gather(ref_lp), "k1") * wm).sum()
                for k, v in metrics.items():
                    sums[k] = sums.get(k, 0.0) + float(v) / len(plan)
            # --clip-grad 0 is no clipping, as in Megatron; torch would scale every gradient to 0
            norm = torch.nn.utils.clip_grad_norm_(self.trainable_parameters(), self.args.clip_grad or math.inf)
            t_opt = time.monotonic()
            grad_norms.append(float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm))
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
            optimizer_seconds += time.monotonic() - t_opt
        t_updated = time.monotonic()

        metrics = dist_utils.all_reduce_sum(dict(sorted(sums.items())))
        metrics.update({f"adv_{k}": float(v) for k, v in adv.stats.items()})
        metrics.update(opd_metrics)
        rewards = [r for r in (getattr(s, "reward", None) for s in flat) if isinstance(r, (int, float))]
        metrics["reward_mean"] = sum(rewards) / len(rewards) if rewards else float("nan")
        metrics["response_length_mean"] = sum(s.response_length for s in flat) / max(1, len(flat))
        metrics["grad_norm"] = sum(grad_norms) / max(1, len(grad_norms))
        metrics["lr"] = self.scheduler.get_last_lr()[0]
        metrics["optimizer_steps"] = len(plan)
        metrics["samples"] = len(flat)
        metrics["rollouts"] = len(rollouts)
        elapsed = time.monotonic() - t0
        metrics["train_seconds"] = elapsed
        # where the step's seconds went (docs/performance.md): cheap, always on
        metrics.update({"perf/train_batching_s": t_batched - t0, "perf/train_logprobs_s": t_logprobs - t_batched,
                        "perf/train_advantages_s": t_advantages - t_logprobs,
                        "perf/train_forward_backward_s": t_updated - t_advantages - optimizer_seconds,
                        "perf/train_optimizer_s": optimizer_seconds})
        metrics["train_tokens_per_second"] = sum(len(s.tokens) for s in flat) / max(elapsed, 1e-9)
        self.step += 1
        return StepResult(self.step, metrics)

    def _apply_opd(self, flat: list[Sample], adv: Advantages,
                   student_lp: dict[int, torch.Tensor]) -> tuple[Advantages, dict[str, float]]:
        """On-policy distillation (`vime.train.opd`): the reverse-KL penalty on the advantages of this
        rank's samples (`student_lp` holds the trainer's log-probs of those before the update; the
        other samples train on other ranks), with the step's KL summed over every rank."""
        teacher = teacher_log_probs(flat)  # every sample has them, or the step stops naming the first
        mine = [i for i, s in enumerate(flat) if id(s) in student_lp]
        masks = [torch.ones(flat[i].response_length) if flat[i].loss_mask is None
                 else torch.tensor(flat[i].loss_mask, dtype=torch.float32) for i in mine]
        result = apply_opd([adv.per_token[i] for i in mine], [student_lp[id(flat[i])] for i in mine],
                           [teacher[i] for i in mine], masks, self.opd_config.opd_kl_coef)
        per_token = list(adv.per_token)
        for i, shaped in zip(mine, result.advantages):
            per_token[i] = shaped
        m = result.metrics
        total = dist_utils.all_reduce_sum({"kl": m["opd_reverse_kl"] * m["opd_tokens"], "tokens": m["opd_tokens"],
                                           "teacher": m["opd_teacher_logprob"] * m["opd_tokens"]})
        n = max(total["tokens"], 1.0)
        return Advantages(per_token, adv.stats), {"opd_reverse_kl": total["kl"] / n,
                                                  "opd_teacher_logprob": total["teacher"] / n}

    # ---- weights out -------------------------------------------------------------------------

    def _gathered_state_dict(self) -> dict[str, torch.Tensor]:
        """The model's full (unsharded) state dict on CPU, a copy that later steps leave as it is;
        collective, the dict is filled on rank 0 only."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        if not self.sharded:  # the unsharded model's own state dict would hold its live CPU parameters
            return {name: t.detach().to("cpu", copy=True) for name, t in self.model.state_dict().items()
                    if not is_adapter_key(name) or is_adapter_key(name, self.adapter)}  # not another run's
        return get_model_state_dict(self.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) weights on CPU with HF names; collective, the dict is filled on rank 0 only.
        With LoRA these are the merged weights (base + adapter), what the policy computes."""
        state = self._gathered_state_dict()
        return merged_weights(state, self.lora.scaling, self.adapter) if self.lora.enabled and state else state

    def adapter_state_dict(self) -> dict[str, torch.Tensor]:
        """The LoRA adapter on CPU under peft's file keys; collective, filled on rank 0 only."""
        if not self.sharded:  # only the adapter's few tensors are copied, not the base
            return adapter_weights({n: p.detach().to("cpu", copy=True) for n, p in self.model.named_parameters()
                                    if is_adapter_key(n, self.adapter)}, self.adapter)
        return adapter_weights(self._gathered_state_dict(), self.adapter)
