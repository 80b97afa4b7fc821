"""Defaults that depend on other flags, and the checks across flags, run once by `parse_args`.

Kept apart from `vime.config.args` (which declares and parses the flags) so each stays one job; every
error names the flags involved and what would work.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from urllib.parse import urlsplit
from typing import Any

from vime.errors import ConfigError


_POSITIVE = (
    "rollout_batch_size", "n_samples_per_prompt", "over_sampling_batch_size", "global_batch_size",
    "micro_batch_size", "num_rollout", "num_epoch", "rollout_max_response_len", "rollout_max_prompt_len",
    "max_tokens_per_gpu", "save_interval", "eval_interval", "vllm_num_servers", "sft_num_steps",
    "n_samples_per_eval_prompt", "max_concurrent_rollouts", "update_weight_buffer_size", "eval_max_response_len",
)
_NON_NEGATIVE = ("max_staleness", "continue_as_new_after_steps", "lr", "min_lr", "lr_warmup_iters", "weight_decay",
                 "clip_grad", "eps_clip", "kl_coef", "kl_loss_coef", "entropy_coef", "tis_clip_low",
                 "custom_rm_timeout", "custom_generate_timeout", "lora_rank")
HOOK_FLAGS = ("rollout_function_path", "custom_generate_function_path", "dynamic_sampling_filter_path",
              "buffer_filter_path", "eval_function_path", "custom_rm_path", "data_source_path")
"""The flags that name a user hook by dotted path (`VimeArgs` attribute names)."""

# Estimators whose advantage compares the rollouts of one prompt (mirrors vime.train.advantages,
# which imports torch; this module must stay light).
GROUP_ESTIMATORS = ("grpo", "gspo", "reinforce_plus_plus_baseline")

DEFAULT_ROLLOUT_FUNCTION = "vime.rollout.vllm_rollout.generate_rollout"
UPSTREAM_FULLY_ASYNC = "vime.rollout.fully_async_rollout.generate_rollout_fully_async"
"""Upstream's fully async rollout function: here it selects the durable pool (`--fully-async`)."""


def resolve(args: Any) -> None:
    """Fill defaults that depend on other flags and reject combinations that cannot work."""
    from vime.plugins import split_path

    for name in _POSITIVE:
        value = getattr(args, name)
        if value is not None and value <= 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be a positive integer, got {value}")
    for name in _NON_NEGATIVE:
        if getattr(args, name) < 0:
            raise ConfigError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    for name in HOOK_FLAGS:
        if getattr(args, name) is not None:
            split_path(getattr(args, name), "--" + name.replace("_", "-"))
    if not 0 <= args.max_failed_sample_ratio <= 1:
        raise ConfigError(f"--max-failed-sample-ratio must be in [0, 1] (a share of a step's samples), "
                          f"got {args.max_failed_sample_ratio}")
    if args.engine_progress_timeout <= 0:
        raise ConfigError(f"--engine-progress-timeout must be > 0 seconds, got {args.engine_progress_timeout}")
    if args.rollout_temperature <= 0:
        raise ConfigError(
            f"--rollout-temperature must be > 0, got {args.rollout_temperature} (0 is greedy decoding, not a policy)"
        )
    if not 0 < args.rollout_top_p <= 1:
        raise ConfigError(f"--rollout-top-p must be in (0, 1], got {args.rollout_top_p}")
    if args.vllm_router_port is not None and not 0 < args.vllm_router_port < 65536:
        raise ConfigError(f"--vllm-router-port must be a TCP port (1-65535), got {args.vllm_router_port}")

    if args.rollout_function_path == UPSTREAM_FULLY_ASYNC:  # upstream's background worker → the durable pool
        args.fully_async, args.rollout_function_path = True, DEFAULT_ROLLOUT_FUNCTION
    if args.fully_async and args.rollout_function_path != DEFAULT_ROLLOUT_FUNCTION:
        raise ConfigError(
            f"--fully-async builds each step from per-group rollout workflows, but --rollout-function-path "
            f"{args.rollout_function_path} produces whole steps itself: drop one of the two")
    if args.eps_clip_high is None:
        args.eps_clip_high = args.eps_clip
    if args.load is None:
        args.load = args.save
    if args.over_sampling_batch_size is None:
        args.over_sampling_batch_size = args.rollout_batch_size
    if args.rollout_batch_size is not None:
        per_rollout = args.rollout_batch_size * args.n_samples_per_prompt
        if args.global_batch_size is None:
            args.global_batch_size = per_rollout
        elif per_rollout % args.global_batch_size:
            raise ConfigError(
                f"--global-batch-size {args.global_batch_size} must divide --rollout-batch-size x "
                f"--n-samples-per-prompt = {per_rollout}, so every rollout step is whole optimizer steps"
            )
    if args.save_interval is not None and args.save is None:
        raise ConfigError("--save-interval needs --save (where to write checkpoints)")
    if args.kl_coef and args.kl_loss_coef:
        raise ConfigError("set only one of --kl-coef (reward penalty) and --kl-loss-coef (loss term)")
    if args.advantage_estimator.startswith("reinforce_plus_plus") and not args.normalize_advantages:
        raise ConfigError(f"--advantage-estimator {args.advantage_estimator} needs --normalize-advantages")
    _check_eval_flags(args)
    if args.use_dynamic_batch_size and args.max_tokens_per_gpu is None:
        raise ConfigError("--use-dynamic-batch-size needs --max-tokens-per-gpu")
    if args.micro_batch_size != 1 and not args.use_dynamic_batch_size:
        raise ConfigError(f"--micro-batch-size {args.micro_batch_size}: vime packs each micro-batch up to "
                          "--max-tokens-per-gpu tokens, never by sample count; drop --micro-batch-size and size "
                          "--max-tokens-per-gpu to what one forward/backward may hold")
    if args.sandbox_backend not in ("bwrap", "e2b"):
        raise ConfigError(f"--sandbox-backend {args.sandbox_backend!r}: choose bwrap or e2b")
    if args.rm_type == "remote_rm" and not args.rm_url:
        raise ConfigError("--rm-type remote_rm needs --rm-url")
    _check_loss_flags(args)
    _check_lora_flags(args)

    if args.run_id is None:
        args.run_id = Path(args.run_dir).name if args.run_dir else time.strftime("run-%Y%m%d-%H%M%S")
    if args.run_dir is None:
        args.run_dir = str(Path("runs") / args.run_id)
    args.run_dir = os.path.abspath(args.run_dir)
    if args.store_url is None:
        args.store_url = f"sqlite:///{Path(args.run_dir) / 'vime.db'}"
    args.vllm_model_routers = _model_urls(args.vllm_model_urls or [])
    from vime.engine.speculation import CPU_REFUSAL, refused_here

    if refused_here(args.vllm_server_args):
        raise ConfigError(f"--vllm-speculative-config: {CPU_REFUSAL}")
    if args.vllm_config is not None:
        from vime.engine.vllm_config import read_vllm_config

        args.vllm_config_data = read_vllm_config(args.vllm_config)
        from vime.config.forward import CHECKED_ENV
        from vime.engine.topology import topology_of

        topology = topology_of(args, check_overrides=os.environ.get(CHECKED_ENV) != "1")  # a bad file fails here
        served = args.vllm_model_routers.get(topology.rollout_model.name)
        if served and not (args.vllm_router_ip or args.vllm_router_port):  # the servers run already (a
            url = urlsplit(served)  # cluster, `vime engine --vllm-config`): generate calls the rollout model's
            args.vllm_router_ip, args.vllm_router_port = url.hostname, url.port or 80


def _check_eval_flags(args: Any) -> None:
    """The eval flags describe sets vime can evaluate: name path pairs with usable names, and
    sampling settings that are a policy (temperature 0 is greedy decoding, fine for evaluation)."""
    from vime.rollout.eval_data import eval_sets

    _take_eval_config(args)
    if args.eval_interval is not None and not args.eval_prompt_data:
        raise ConfigError("--eval-interval needs --eval-prompt-data (name path pairs) or --eval-config FILE")
    eval_sets(args)  # pairs, names
    if args.eval_temperature is not None and args.eval_temperature < 0:
        raise ConfigError(f"--eval-temperature must be >= 0 (0: greedy), got {args.eval_temperature}")
    if args.eval_top_p is not None and not 0 < args.eval_top_p <= 1:
        raise ConfigError(f"--eval-top-p must be in (0, 1], got {args.eval_top_p}")


def _take_eval_config(args: Any) -> None:
    """`--eval-config`: its content (read from the file, or as recorded with the run's flags for
    that file: `--eval-config-data`), and its sets as the run's eval sets. As in slime, the file
    replaces `--eval-prompt-data` (the launcher says so when both are given)."""
    from vime.config.eval_config import check_eval_config, eval_config_sets, read_eval_config

    recorded = args.eval_config_data
    if args.eval_config is None:
        if recorded is not None:
            raise ConfigError("--eval-config-data is vime's record of an --eval-config file's content; pass "
                              "--eval-config FILE instead")
        return
    if recorded is None or recorded.get("source") != args.eval_config:
        args.eval_config_data = read_eval_config(args.eval_config)
    else:  # recorded by a launch (or hand-edited in `vime config`'s JSON): checked again, kept as it is
        check_eval_config({"datasets": recorded.get("datasets")}, args.eval_config)
    args.eval_prompt_data = eval_config_sets(args.eval_config_data)


def _model_urls(pairs: list[str]) -> dict[str, str]:
    urls = {}
    for pair in pairs:
        name, sep, url = pair.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise ConfigError(f"--vllm-model-urls {pair!r}: expected NAME=http://HOST:PORT (e.g. reward=http://10.0.0.3:8000)")
        urls[name] = url.rstrip("/")
    return urls


def trains_on_rollouts(args: Any) -> bool:
    """Whether the command line describes RL training on rollouts: a policy loss, a number of
    prompts per rollout step and a length (`vime train` requires all three). A script that only
    generates rollouts, or `vime sft`, does not."""
    return (args.loss_type == "policy_loss" and args.rollout_batch_size is not None
            and (args.num_rollout is not None or args.num_epoch is not None))


def _check_lora_flags(args: Any) -> None:
    """`--lora-*` and `--target-modules`: values peft would refuse late, on the trainer, refused here."""
    import importlib.util

    if not args.lora_rank:
        for name in ("target_modules", "lora_save_merged"):
            if getattr(args, name):
                raise ConfigError(f"--{name.replace('_', '-')} needs --lora-rank (a rank > 0 turns LoRA on)")
        return
    if args.lora_alpha <= 0:
        raise ConfigError(f"--lora-alpha must be > 0 (the update is scaled by alpha / rank), got {args.lora_alpha}")
    if not 0 <= args.lora_dropout < 1:
        raise ConfigError(f"--lora-dropout must be in [0, 1), got {args.lora_dropout}")
    targets = args.target_modules or []
    if "all-linear" in targets and len(targets) > 1:
        raise ConfigError(f"--target-modules {' '.join(targets)}: all-linear stands alone; drop it or the names")
    served = list(args.vllm_server_args or [])
    if "--max-lora-rank" in served[:-1]:
        max_rank = served[served.index("--max-lora-rank") + 1]
        if max_rank.isdigit() and int(max_rank) < args.lora_rank:
            raise ConfigError(f"--lora-rank {args.lora_rank} is above --vllm-max-lora-rank {max_rank}: the servers "
                              f"could not load the run's adapter; raise --vllm-max-lora-rank or lower --lora-rank")
    if importlib.util.find_spec("peft") is None:
        raise ConfigError(f"--lora-rank {args.lora_rank} trains a peft adapter and peft is not installed: "
                          "pip install 'vime[lora]'")


def _check_loss_flags(args: Any) -> None:
    """Refuse algorithm flags that would be silently ignored: each would train something other
    than what the user asked for, and nothing in the metrics would say so."""
    estimator = args.advantage_estimator
    if args.eps_clip_c is not None and args.eps_clip_c <= 1:
        raise ConfigError(f"--eps-clip-c must be > 1 (the dual-clip bound is -A x eps_clip_c), got {args.eps_clip_c}")
    if args.eps_clip_high < 0:
        raise ConfigError(f"--eps-clip-high must be >= 0, got {args.eps_clip_high}")
    if args.tis_clip <= 0 or args.tis_clip_low > args.tis_clip:
        raise ConfigError(
            f"--tis-clip-low {args.tis_clip_low} / --tis-clip {args.tis_clip}: the TIS ratio is clipped to "
            "[low, high], so --tis-clip must be > 0 and >= --tis-clip-low"
        )
    if not 0 <= args.mis_low < args.mis_high:
        raise ConfigError(
            f"--mis-low {args.mis_low} / --mis-high {args.mis_high}: --use-mis keeps the tokens whose ratio lies "
            "in [low, high], so 0 <= --mis-low < --mis-high"
        )
    if args.kl_coef and estimator not in ("reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        raise ConfigError(
            f"--kl-coef {args.kl_coef} shapes the reward of the REINFORCE++ estimators; --advantage-estimator "
            f"{estimator} ignores it (as slime's does): use --use-kl-loss --kl-loss-coef {args.kl_coef} instead"
        )
    if args.kl_loss_coef and not args.use_kl_loss:
        raise ConfigError(
            f"--kl-loss-coef {args.kl_loss_coef} has no effect without --use-kl-loss: add --use-kl-loss"
        )
    if args.opd_type == "megatron":
        raise ConfigError(
            "--opd-type megatron: vime has no teacher inside the trainer; its teacher is a server that scores "
            "each rollout: serve it (a --vllm-config model named teacher, or --vllm-model-urls teacher=URL), score "
            "with --custom-rm-path vime.rollout.on_policy_distillation.reward_func and pass --opd-type vllm"
        )
    if args.opd_type is not None and not args.use_opd:
        raise ConfigError(f"--opd-type {args.opd_type} has no effect without --use-opd: add --use-opd")
    if trains_on_rollouts(args) and estimator in GROUP_ESTIMATORS and args.n_samples_per_prompt == 1:
        raise ConfigError(
            f"--advantage-estimator {estimator} compares the responses of one prompt; with "
            "--n-samples-per-prompt 1 every advantage is 0 and nothing trains: use --n-samples-per-prompt 2 "
            "or more, or --advantage-estimator reinforce_plus_plus --normalize-advantages"
        )
