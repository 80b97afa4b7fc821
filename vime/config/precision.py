"""Rollouts in a lower precision than the trainer, and the correction that goes with them.

Rollout servers can sample in less precision than the trainer computes in: fp8 weights on GPUs
(`--vllm-quantization fp8`), bfloat16 servers next to a float32 trainer on CPU
(`--vllm-dtype bfloat16`). Then the rollout's logprobs are not the trainer's even for the same
weights, and the policy loss's ratio is off-policy by that gap. Truncated importance sampling
(`--use-tis`, from #7) reweights each token by trainer/rollout probability, so when the
precisions differ and the command line says nothing about TIS or MIS, TIS is turned on
(`--no-use-tis` keeps it off).

The trainer computes in float32 on CPU and bfloat16 on GPUs (`vime.train.trainer`); a CPU build
of vLLM means a CPU host, so its trainer is float32.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

LOW_PRECISION_FLAGS = ("--quantization", "--kv-cache-dtype")
DTYPE_NAMES = {"bfloat16": "bfloat16", "bf16": "bfloat16", "float16": "float16", "half": "float16",
               "fp16": "float16", "float32": "float32", "float": "float32", "fp32": "float32"}


@dataclass(frozen=True)
class Precisions:
    rollout: str  # "bfloat16", "float32", "fp8 (quantization)", or "auto" (the checkpoint's)
    trainer: str

    @property
    def differ(self) -> bool:
        return self.rollout not in (self.trainer, "auto")


def precisions(server_args: list[str], *, cpu: bool) -> Precisions:
    """The rollout servers' precision as their flags set it, against the trainer's."""
    from vime.engine.server import _flag_value

    trainer = "float32" if cpu else "bfloat16"
    for flag in LOW_PRECISION_FLAGS:
        value = _flag_value(server_args, flag)
        if value and value != "auto":
            return Precisions(f"{value} ({flag[2:]})", trainer)
    dtype = _flag_value(server_args, "--dtype")
    rollout = DTYPE_NAMES.get(dtype or "", "auto") if dtype else ("float32" if cpu else "auto")
    return Precisions(rollout, trainer)


def run_precisions(args: Any) -> Precisions:
    """The policy servers' precision against the trainer's, for a run's flags: `--vllm-*` flags,
    then each server group of the policy in `--vllm-config` (the first group that differs wins)."""
    from vime.engine.server import is_cpu_build

    cpu = is_cpu_build()
    seen = precisions(list(args.vllm_server_args), cpu=cpu)
    if not seen.differ and args.vllm_config_data is not None:
        from vime.engine.topology import topology_of

        policy = topology_of(args, check_overrides=False).policy
        for group in policy.groups if policy else []:
            seen = precisions([*args.vllm_server_args, *group.server_args], cpu=cpu)
            if seen.differ:
                break
    return seen


def resolve_precision(args: Any, given: Collection[str], *, training: bool) -> None:
    """Once per parse: record whether the policy servers sample in another precision than the
    trainer (`args.low_precision_rollouts`, which the weight-sync check reads), and for a training
    run whose command line set neither `use_tis` nor `use_mis` (`given`: the flags it set), turn
    TIS on and say why (`args.tis_because`)."""
    seen = run_precisions(args)
    args.low_precision_rollouts = seen.differ
    if not seen.differ or not training or "use_tis" in given or "use_mis" in given:
        return
    args.use_tis = True
    args.tis_because = (f"rollouts sample in {seen.rollout}, the trainer computes in {seen.trainer}: --use-tis is "
                        "on (truncated importance sampling corrects the gap; --no-use-tis turns it off)")
