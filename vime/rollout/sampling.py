"""Sampling parameters, in vLLM's names, from the `--rollout-*` flags.

slime builds SGLang's dict (`max_new_tokens`, `no_stop_trim`); vime speaks vLLM's
`SamplingParams` (`max_tokens`, `include_stop_str_in_output`), which is what a custom generate
function receives and what `/inference/v1/generate` takes.

Seeds: each sample gets `seed = --rollout-seed + sample.index` (see `params_for_sample`).
Indices are unique in a run and stable across retries, so a retried rollout activity asks vLLM
for the same draw (same weights, same tokens where the engine is deterministic), while the n
samples of a group still differ from each other.
"""

from __future__ import annotations

from typing import Any

from vime.types import Sample

_SEED_MOD = 2**63


def eval_or(args: Any, name: str, evaluation: bool) -> Any:
    """`args.eval_<name>` during evaluation when set (`--eval-temperature`, `--eval-top-p`,
    `--eval-top-k`, `--eval-max-response-len`), else `args.rollout_<name>`."""
    if evaluation:
        # user namespace: a hook's own args object may lack the eval flags; vime declares no eval_stop*
        value = getattr(args, f"eval_{name}", None)
        if value is not None:
            return value
    return getattr(args, f"rollout_{name}")


def sampling_params_from_args(args: Any, evaluation: bool = False) -> dict[str, Any]:
    """The base sampling parameters of a rollout (no per-sample seed; see `params_for_sample`).

    Stop strings stay in the output (`include_stop_str_in_output`), so the decoded response
    matches the sampled token ids, which always include the stop token.
    """
    def pick(name: str, default: Any) -> Any:
        value = eval_or(args, name, evaluation)
        return default if value is None else value

    params: dict[str, Any] = {
        "temperature": float(pick("temperature", 1.0)),
        "top_p": float(pick("top_p", 1.0)),
        "top_k": int(pick("top_k", -1)),
        "skip_special_tokens": bool(args.rollout_skip_special_tokens),
        "spaces_between_special_tokens": False,
    }
    max_tokens = eval_or(args, "max_response_len", evaluation)
    if max_tokens is not None:
        params["max_tokens"] = int(max_tokens)
    stop = eval_or(args, "stop", evaluation)
    if stop:
        params["stop"] = [stop] if isinstance(stop, str) else list(stop)
        params["include_stop_str_in_output"] = True
    stop_token_ids = eval_or(args, "stop_token_ids", evaluation)
    if stop_token_ids:
        params["stop_token_ids"] = [int(t) for t in stop_token_ids]
    return params


def sample_seed(args: Any, sample: Sample) -> int | None:
    """`--rollout-seed + sample.index` (None when either is unset)."""
    base = args.rollout_seed
    if base is None or sample.index is None:
        return None
    return (int(base) + int(sample.index)) % _SEED_MOD


def params_for_sample(base: dict[str, Any], args: Any, sample: Sample) -> dict[str, Any]:
    """A copy of `base` with this sample's seed, unless `base` already fixes one."""
    params = dict(base)
    if "seed" not in params:
        seed = sample_seed(args, sample)
        if seed is not None:
            params["seed"] = seed
    return params
