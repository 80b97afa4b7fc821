"""Every flag vime declares, as the fields of one typed dataclass, `VimeArgs`: the field is the
flag, its type, default, help and group (`vime.config.args` builds the parser from them and parses).

Why a dataclass rather than a Namespace: hooks written for slime read `args.rollout_max_response_len`
and sometimes set attributes of their own, so `VimeArgs` keeps attribute access and takes new
attributes, while the fields give types, defaults and one place to read. Once parsed it is the run's
config and read-only (`read_only()`): assigning a field raises and names the flag to set instead,
because a hook or module that changed `args.rollout_batch_size` in one worker would run a config no
other process and no stored record agrees with. (Read-only is one level deep: the lists and dicts
inside are the run's too; `replace(**changes)` makes a changed copy, for tests.)
`VimeArgs.argv` keeps the command line, followed by the resolved `--run-id` and `--run-dir`, so
another process (a worker, in any directory) gets the same run from `parse_args(args.argv)`.

Standard library only (and the estimator names): parsing flags must stay cheap.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
from dataclasses import dataclass, field
from typing import Any

from vime.train.estimators import ESTIMATORS

GROUPS = {
    "data": "Prompt data and how records map to samples.",
    "rollout": "Generation: batch sizes, sampling parameters, rollout and generate hooks, evaluation.",
    "reward": "Reward functions and reward services.",
    "training": "Optimizer, batching and the FSDP2 trainer.",
    "algorithm": "Advantages, clipping, KL and the loss.",
    "checkpoint": "Where checkpoints are saved and loaded.",
    "orchestration": "Temporal, task queues, the run directory and the sample store.",
    "sandbox": "Sandboxes: where agents run their tools and rollouts are graded.",
    "vLLM": (
        "Rollout servers. Every `vllm serve` flag also works as --vllm-<flag> "
        "(--vllm-max-model-len 4096, --vllm-enforce-eager, ...); only the ones you set are forwarded. "
        "--vllm-model/--vllm-host/--vllm-port are set by vime."
    ),
    "router": (
        "The vllm-router in front of the servers. Every router flag also works as --router-<flag> "
        "(--router-balance-abs-threshold 32, ...); only the ones you set are forwarded."
    ),
    "metrics": (
        "Where each step's metrics go besides <run-dir>/metrics.jsonl: TensorBoard (when installed), "
        "W&B (slime's --wandb-* flags), a Prometheus endpoint on the rollout worker."
    ),
}



def _flag(group: str, default: Any, help: str, **argparse_kwargs: Any) -> Any:
    """A `VimeArgs` field that is also a command-line flag (`--field-name` unless `flag=` says)."""
    meta = {"help": help, "group": group, **argparse_kwargs}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


(_data, _rollout, _reward, _training, _algorithm, _checkpoint, _orchestration, _sandbox, _vllm, _router,
 _metrics) = (
    functools.partial(_flag, group) for group in GROUPS
)


def _json_object(raw: str) -> dict:
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"invalid JSON {raw!r}: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {raw!r}")
    return value


@dataclass
class VimeArgs:
    """Every `vime` setting, typed; attribute names are slime's argparse dests."""

    # data
    prompt_data: str | None = _data(None, "JSONL/Parquet prompt file.")
    input_key: str = _data("input", "Record key of the prompt.")
    label_key: str | None = _data(None, "Record key of the label.")
    metadata_key: str = _data("metadata", "Record key of per-sample metadata.")
    tool_key: str = _data("tools", "Record key of the tools given to the chat template.")
    apply_chat_template: bool = _data(False, "Prompts are chat messages; render them with the template.")
    apply_chat_template_kwargs: dict = _data({}, "JSON object of extra chat-template kwargs.", type=_json_object)
    num_rollout: int | None = _data(None, "Number of rollout steps (default: from --num-epoch).")
    num_epoch: int | None = _data(None, "Epochs over --prompt-data; ignored when --num-rollout is set.")
    data_source_path: str | None = _data(None, "Custom data source class (dotted path).")
    eval_prompt_data: list[str] | None = _data(None, "Eval sets as name path pairs: aime /data/aime.jsonl.")
    eval_config: str | None = _data(
        None, "YAML or JSON file of eval sets, each with its own path, record keys, samples per prompt, sampling and "
              "reward or generate function (slime's --eval-config; it replaces --eval-prompt-data). "
              "See docs/evaluation.md.")
    eval_config_data: dict | None = _data(None, argparse.SUPPRESS, type=_json_object)
    """--eval-config's content as read at launch, appended to the run's recorded flags (`VimeArgs.argv`) so
    workers and `vime eval RUN` evaluate what the run was started with, not what the file says later."""
    sft_data: str | None = _data(
        None, "`vime sft`: JSONL, one Sample.to_dict() per line; loss_mask marks the tokens to learn."
    )

    # rollout
    hf_checkpoint: str | None = _rollout(None, "HF checkpoint: the policy's weights, config and tokenizer.")
    rollout_function_path: str = _rollout(
        "vime.rollout.vllm_rollout.generate_rollout",
        "generate_rollout(args, rollout_id, data_source, evaluation=False).",
    )
    custom_generate_function_path: str | None = _rollout(
        None, "async generate(args, sample, sampling_params[, evaluation]) -> Sample | list[Sample]."
    )
    custom_generate_timeout: float = _rollout(
        900.0, "Seconds one --custom-generate-function-path call may take; past it the sample is FAILED "
               "(timed out) and the run goes on (0: no limit).")
    max_failed_sample_ratio: float = _rollout(
        0.1, "Rate at which a hook may fail samples (raise or time out) before the run stops with the first "
             "error: a step stops when its failures exceed this rate by more than chance allows (2.5 standard "
             "deviations). A group with a failed sample is dropped whole and replaced (0: stop at the first "
             "failure; 1: never stop, unless every sample fails).")
    rollout_batch_size: int | None = _rollout(None, "Prompts per rollout step.")
    n_samples_per_prompt: int = _rollout(1, "Responses per prompt (the group size).")
    over_sampling_batch_size: int | None = _rollout(None, "Prompts per sampling round (default: rollout batch).")
    rollout_max_response_len: int | None = _rollout(None, "max_tokens per response.")
    rollout_max_prompt_len: int | None = _rollout(None, "Drop prompts longer than this many tokens.")
    rollout_temperature: float = _rollout(1.0, "Sampling temperature (> 0).")
    rollout_top_p: float = _rollout(1.0, "Sampling top-p.")
    rollout_top_k: int = _rollout(-1, "Sampling top-k (-1: off).")
    rollout_stop: list[str] | None = _rollout(None, "Stop strings.")
    rollout_stop_token_ids: list[int] | None = _rollout(None, "Stop token ids.")
    rollout_skip_special_tokens: bool = _rollout(False, "Strip special tokens from response text.")
    rollout_seed: int = _rollout(42, "Seed for prompt shuffling and sampling.")
    rollout_shuffle: bool = _rollout(False, "Shuffle prompts.")
    dynamic_sampling_filter_path: str | None = _rollout(None, "Keep or drop a finished group (DAPO-style).")
    buffer_filter_path: str | None = _rollout(None, "Pick groups from the buffer: list[list[Sample]] -> same.")
    max_staleness: int = _rollout(0, "Weight versions a sample may lag the trainer by (0: on-policy).")
    fully_async: bool = _rollout(
        False, "Keep --max-concurrent-rollouts groups in flight at all times and build each step from groups "
               "in the order they finish (within --max-staleness); also set by upstream's "
               "--rollout-function-path vime.rollout.fully_async_rollout.generate_rollout_fully_async.")
    max_concurrent_rollouts: int | None = _rollout(
        None, "Fully async: prompt groups generating at once (default: --rollout-batch-size).")
    staleness_control: str = _rollout(
        "pace", "Fully async: pace (start no group that would exceed --max-staleness) or discard (keep the pool "
                "full; drop and count groups past the bound).", choices=("pace", "discard"))
    eval_function_path: str | None = _rollout(
        None, "Eval rollout function, slime's hook: generate_rollout(args, rollout_id, data_source, evaluation=True) "
              "-> {set: {rewards, truncated, samples}} or eval groups (default: --rollout-function-path; vime's "
              "own evaluates each eval prompt as a durable group workflow).")
    eval_interval: int | None = _rollout(
        None, "Evaluate the --eval-prompt-data sets at step 0, every N steps and after the last step.")
    skip_eval_before_train: bool = _rollout(False, "No eval round at step 0 (the baseline).")
    n_samples_per_eval_prompt: int = _rollout(1, "Responses per eval prompt (pass@k for k up to this).")
    eval_input_key: str | None = _rollout(None, "Record key of the eval prompt (default: --input-key).")
    eval_label_key: str | None = _rollout(None, "Record key of the eval label (default: --label-key).")
    eval_tool_key: str | None = _rollout(None, "Record key of the eval tools (default: --tool-key).")
    eval_temperature: float | None = _rollout(None, "Eval sampling temperature (default: --rollout-temperature; "
                                                    "0: greedy).")
    eval_top_p: float | None = _rollout(None, "Eval sampling top-p (default: --rollout-top-p).")
    eval_top_k: int | None = _rollout(None, "Eval sampling top-k (default: --rollout-top-k).")
    eval_max_response_len: int | None = _rollout(None, "Eval max_tokens per response (default: "
                                                       "--rollout-max-response-len).")

    # reward
    custom_rm_path: str | None = _reward(None, "async rm(args, sample) -> float; with --group-rm samples -> list.")
    custom_rm_timeout: float = _reward(
        300.0, "Seconds one --custom-rm-path call may take; past it the sample is FAILED (timed out) and the "
               "run goes on (0: no limit).")
    group_rm: bool = _reward(False, "Call the reward function once per group.")
    rm_type: str | None = _reward(None, "Built-in reward type.")
    rm_url: str | None = _reward(None, "Reward service URL (for --rm-type remote_rm).")
    reward_key: str | None = _reward(None, "Key of the reward when a reward function returns a dict.")

    # training
    lr: float = _training(1e-6, "Learning rate.")
    min_lr: float = _training(0.0, "Floor of the decayed learning rate.")
    lr_decay_style: str = _training("constant", "Learning-rate schedule.", choices=("constant", "linear", "cosine"))
    lr_warmup_iters: int = _training(0, "Linear warmup steps.")
    weight_decay: float = _training(0.0, "AdamW weight decay.")
    adam_beta1: float = _training(0.9, "AdamW beta1.")
    adam_beta2: float = _training(0.95, "AdamW beta2.")
    clip_grad: float = _training(1.0, "Gradient-norm clip (0: no clipping, as in Megatron).")
    global_batch_size: int | None = _training(
        None, "Samples per optimizer step (default: rollout-batch-size x n-samples-per-prompt)."
    )
    micro_batch_size: int = _training(
        1, "slime's samples per forward/backward. vime always packs micro-batches by tokens (--max-tokens-per-gpu), "
           "so only 1 is accepted, or any value with --use-dynamic-batch-size, which ignores it as slime does.")
    use_dynamic_batch_size: bool = _training(
        False, "Pack micro-batches up to --max-tokens-per-gpu (which it then requires). vime always packs so; "
               "the flag keeps slime command lines working and lets --micro-batch-size through.")
    max_tokens_per_gpu: int | None = _training(
        None, "Token budget of a packed micro-batch (default: 8192 on GPUs, 1024 on CPU).")
    gradient_checkpointing: bool = _training(False, "Recompute activations in backward.")
    seed: int = _training(1234, "Trainer seed.")
    lora_rank: int = _training(
        0, "LoRA rank (0: LoRA off, full fine-tuning). With a rank the base checkpoint stays frozen and only a "
           "peft adapter trains (docs/lora.md); needs peft (pip install 'vime[lora]').")
    lora_alpha: float = _training(16.0, "LoRA alpha: the adapter's update is scaled by alpha / rank.")
    lora_dropout: float = _training(
        0.0, "Dropout on the adapter's input while training, in [0, 1). Above 0 the trainer's logprobs "
             "are stochastic, so importance ratios see the noise.")
    target_modules: list[str] | None = _training(
        None, "Modules the adapter wraps, by name (q_proj v_proj ...), or all-linear (the default: every "
              "linear layer but the LM head).", nargs="+")
    sft_num_steps: int | None = _training(
        None, "`vime sft`: optimizer steps (default: --num-epoch passes over --sft-data, 1 if unset)."
    )

    # algorithm
    advantage_estimator: str = _algorithm("grpo", "Advantage estimator.", choices=ESTIMATORS)
    eps_clip: float = _algorithm(0.2, "PPO clip range.")
    eps_clip_high: float | None = _algorithm(None, "Upper clip range (default: --eps-clip).")
    eps_clip_c: float | None = _algorithm(
        None, "Dual-clip: bound the loss of a negative advantage A by -A x this (> 1; default: off)."
    )
    kl_coef: float = _algorithm(
        0.0, "KL penalty folded into the reward (REINFORCE++ estimators; for GRPO use --use-kl-loss)."
    )
    use_kl_loss: bool = _algorithm(False, "Add a KL-to-reference term to the loss (weight --kl-loss-coef).")
    kl_loss_coef: float = _algorithm(0.0, "Weight of the KL loss term (with --use-kl-loss).")
    kl_loss_type: str = _algorithm("k1", "KL estimator.", choices=("k1", "k2", "k3", "low_var_kl"))
    entropy_coef: float = _algorithm(0.0, "Entropy bonus weight.")
    use_tis: bool = _algorithm(
        False, "Truncated importance sampling against rollout logprobs (on by default when the rollout servers "
        "sample in another precision than the trainer: --vllm-dtype bfloat16 on CPU, fp8 on GPUs).",
        action=argparse.BooleanOptionalAction)
    tis_clip: float = _algorithm(2.0, "Upper clip of the TIS ratio (with --use-tis).")
    tis_clip_low: float = _algorithm(0.0, "Lower clip of the TIS ratio (with --use-tis).")
    use_mis: bool = _algorithm(
        False, "Masked importance sampling: drop tokens whose trainer/rollout logprob ratio leaves [--mis-low, "
        "--mis-high] from the policy loss; weight the others by that ratio (truncated by --tis-clip with --use-tis)."
    )
    mis_low: float = _algorithm(0.5, "Lower bound of the MIS ratio band (with --use-mis).")
    mis_high: float = _algorithm(2.0, "Upper bound of the MIS ratio band (with --use-mis).")
    loss_type: str = _algorithm("policy_loss", "Loss.", choices=("policy_loss", "sft_loss"))
    normalize_advantages: bool = _algorithm(
        False, "Whiten advantages over the rollout batch's loss tokens (required by the REINFORCE++ estimators)."
    )
    disable_grpo_std_normalization: bool = _algorithm(
        False, "Do not divide GRPO/GSPO advantages by the group std (Dr. GRPO): advantage = reward - group mean."
    )
    use_opd: bool = _algorithm(
        False, "On-policy distillation: each sampled token's advantage loses --opd-kl-coef x (student - teacher "
        "logprob), its reverse KL to the teacher; samples carry teacher_log_probs (see examples/on_policy_distillation)."
    )
    opd_type: str | None = _reward(
        None, "OPD: where teacher logprobs come from: vllm, a frozen teacher server scoring each rollout "
        "(--custom-rm-path vime.rollout.on_policy_distillation.reward_func); slime's sglang means the same here "
        "(default with --use-opd: vllm). slime's megatron (a teacher inside the trainer) is refused.",
        choices=("vllm", "sglang", "megatron"))
    opd_kl_coef: float = _algorithm(1.0, "Weight of the reverse KL to the teacher in the advantage (with --use-opd).")

    # checkpoint
    save: str | None = _checkpoint(None, "Checkpoint directory.")
    save_interval: int | None = _checkpoint(None, "Save every N rollout steps.")
    load: str | None = _checkpoint(None, "Resume from this directory (default: --save).")
    lora_save_merged: bool = _checkpoint(
        False, "With --lora-rank: also save each checkpoint's merged HF weights (base + adapter) beside its "
               "adapter/, for tools that load plain HF weights.")
    ref_load: str | None = _checkpoint(
        None, "HF checkpoint of the reference model for the KL terms (default: --hf-checkpoint)."
    )

    # orchestration
    run_id: str | None = _orchestration(
        None, "Run name; the same id resumes the run (default: --run-dir's name, else a timestamp)."
    )
    run_dir: str | None = _orchestration(None, "Run directory (default: runs/<run-id>).")
    temporal_address: str | None = _orchestration(None, "Temporal host:port (default: start an embedded dev server).")
    temporal_namespace: str = _orchestration("default", "Temporal namespace.")
    rollout_task_queue: str = _orchestration("vime-rollout", "Queue of rollout workflows and light activities.")
    sandbox_task_queue: str = _orchestration("vime-sandbox", "Queue of sandbox activities.")
    trainer_task_queue: str = _orchestration(
        "vime-trainer", "Queue where trainers announce themselves; each also serves its own queue."
    )
    max_runs_per_trainer: int = _orchestration(
        4, "A long-lived trainer (started with connections only) holds up to this many LoRA runs of one base "
        "model at once: the base loaded once, each run its own adapter and optimizer state, their steps taken "
        "in turn. Full fine-tunes and multi-rank trainers hold one run."
    )
    heartbeat_timeout: float = _orchestration(
        60.0, "Seconds without a heartbeat before a worker counts as dead and its activity is retried "
        "(the trainer's, and a --rollout-function-path hook's; vime's rollout activities use at most 6 s, so a "
        "start the dev server lost is found in seconds)."
    )
    vllm_server_urls: list[str] | None = _orchestration(
        None, "vLLM servers to push weights to (default: the ones vime starts).", nargs="+"
    )
    weight_sync_engine: str = _orchestration(
        "file", "How the trainer pushes weights into the vLLM servers: file (a safetensors file in /dev/shm: "
                "servers on the trainer's host) or collective (a gloo/NCCL broadcast to every server's workers; "
                "the servers need --vllm-weight-transfer-config '{\"backend\": \"vime_collective\"}').",
        choices=("file", "collective"),
    )
    update_weight_mode: str = _orchestration(
        "full", "full: every sync sends all weights; delta: after a first full sync, only the elements whose "
                "bits changed since the last one.", choices=("full", "delta")
    )
    update_weight_buffer_size: int = _orchestration(
        64 << 20, "Bytes per broadcast bucket of --weight-sync-engine collective."
    )
    vllm_model_urls: list[str] | None = _orchestration(
        None, "NAME=URL of each model a --vllm-config serves (default: the ones vime starts); a reward "
              "function finds them in args.vllm_model_routers.", nargs="+"
    )
    store_url: str | None = _orchestration(None, "SQLAlchemy URL of the sample store (default: SQLite in run dir).")
    fleet: str | None = _orchestration(
        None, "Run on the shared fleet `vime fleet --fleet-dir DIR` serves (its Temporal, store, LoRA-enabled "
              "vLLM server and workers), starting nothing; needs --lora-rank (the fleet's base model is shared).")
    continue_as_new_after_steps: int = _orchestration(
        0, "Start a fresh training-workflow run (continue-as-new) every N steps, bounding its history "
           "(0: when Temporal suggests it)."
    )

    rollout_env: str = _orchestration(
        "groups", "Rollout environment: a built-in (groups: single-turn prompt groups; coding_agent; multi_agent; "
                  "tool_use), a name an installed package registers (entry-point group vime.environments) or a "
                  "module's dotted path whose ENVIRONMENT declares one (docs/environments.md). "
                  "Its flags are listed by `vime train --rollout-env NAME --help`."
    )
    rollout_workflow: str | None = _orchestration(
        None, "Before --rollout-env: RolloutWorkflow (= --rollout-env groups) or CodingAgentRolloutWorkflow "
              "(= --rollout-env coding_agent).", choices=("RolloutWorkflow", "CodingAgentRolloutWorkflow"),
    )

    # sandbox
    sandbox_backend: str = _sandbox("bwrap", "Sandbox backend: bwrap (local bubblewrap) or e2b.")
    sandbox_workspace_mb: int = _sandbox(
        1024, "bwrap: size cap of a sandbox's /workspace, MiB (a tmpfs mounted on the host: RAM); 0: an "
              "uncapped host directory, which a worker that may not mount (not root) falls back to, warning once."
    )
    sandbox_tmp_mb: int = _sandbox(256, "bwrap: size cap of each command's private /tmp, MiB (RAM).")
    sandbox_shm_mb: int = _sandbox(64, "bwrap: size cap of each command's private /dev/shm, MiB (RAM).")
    sandbox_cpu_seconds: int = _sandbox(
        600, "bwrap: CPU seconds each process of a sandboxed command may use (SIGXCPU past them), "
             "beside its wall-clock timeout."
    )
    sandbox_max_concurrent: int = _sandbox(
        0, "bwrap: sandboxed commands one worker process runs at once; the others wait, their timeout "
           "not yet started (0: 4 per CPU core of the process, at least 8)."
    )

    # vLLM: vime's own --vllm-* flags, which take precedence over generated ones
    vllm_config: str | None = _vllm(None, "YAML: server groups, models and per-group overrides.")
    vllm_router_ip: str | None = _vllm(None, "Host that generate functions call: the router, or the one server.")
    vllm_router_port: int | None = _vllm(None, "Port that generate functions call.")
    vllm_num_servers: int = _vllm(1, "vLLM servers to start.")
    engine_progress_timeout: float = _vllm(
        60.0, "Seconds a generate request may go without any answer from vLLM before it counts as an "
              "infrastructure failure (the rollout is retried)."
    )
    engine_host: str = _vllm("127.0.0.1", "`vime engine`: the address the server listens on.")
    engine_port: int = _vllm(8000, "`vime engine`: the port the server listens on.")

    # router
    router_policy: str = _router("cache_aware", "Routing policy; consistent_hash keeps a session on one server.")

    # metrics: slime's W&B flags (vime.metrics.wandb_sink), the rollout worker's Prometheus port
    use_wandb: bool = _metrics(False, "Log every metrics.jsonl line to Weights & Biases (pip install vime[wandb]).")
    wandb_mode: str | None = _metrics(
        None, "W&B mode (default: $WANDB_MODE, else online); offline keeps the run under --wandb-dir for "
              "`wandb sync`.", choices=("online", "offline", "disabled"))
    wandb_dir: str | None = _metrics(None, "Directory of W&B's files (default: the run directory).")
    wandb_key: str | None = _metrics(
        None, "W&B API key (default: $WANDB_API_KEY or `wandb login`). Never recorded with the run's flags: "
              "`vime train` passes it to its workers as WANDB_API_KEY; long-lived workers need that variable.")
    wandb_host: str | None = _metrics(None, "W&B server URL (default: W&B's cloud).")
    wandb_team: str | None = _metrics(None, "W&B entity (team or user) of the run.")
    wandb_group: str | None = _metrics(None, "W&B group of the run.")
    wandb_project: str | None = _metrics(None, "W&B project (default: vime).")
    wandb_run_id: str | None = _metrics(
        None, "W&B run id (default: one made at the run's first line, kept in <run-dir>/wandb-run.json): "
              "a resumed run continues the same W&B run.")
    metrics_port: int | None = _metrics(
        None, "Serve Prometheus metrics on this port from the rollout worker (steps, samples, failures, "
              "task-queue backlogs, sync and phase times, per run); 0 picks a free port.")

    # derived, not flags
    vllm_server_args: list[str] = field(default_factory=list)
    router_args: list[str] = field(default_factory=list)
    vllm_config_data: dict | None = None
    vllm_model_routers: dict[str, str] = field(default_factory=dict)  # model name -> URL (its router or server)
    tis_because: str = ""  # why --use-tis was turned on by default (vime.config.precision), for the console
    low_precision_rollouts: bool = False  # the policy servers sample in another precision than the trainer
    env_args: Any = None  # the environment's own flags (its Environment.flags dataclass), or None
    argv: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__dict__.get("_read_only") and name in _FIELD_NAMES:
            flag = _OPTIONS.get(name)
            how = f"set {flag} on the command line or in the JSON of `vime config`" if flag else "it is derived from the flags"
            raise dataclasses.FrozenInstanceError(
                f"args.{name} is the run's config and read-only once parsed: {how}; a hook may keep "
                "attributes of its own on args (any name that is not a flag)")
        object.__setattr__(self, name, value)

    def read_only(self) -> VimeArgs:
        """This config, its fields read-only from now on (the parser's last step)."""
        object.__setattr__(self, "_read_only", True)
        return self

    def replace(self, **changes: Any) -> VimeArgs:
        """A copy with `changes`, read-only like this one."""
        copy = dataclasses.replace(self, **changes)
        return copy.read_only() if self.__dict__.get("_read_only") else copy


_FIELD_NAMES = frozenset(f.name for f in dataclasses.fields(VimeArgs))


def flag_fields() -> list[dataclasses.Field]:
    """The `VimeArgs` fields that are command-line flags, in declaration order."""
    return [f for f in dataclasses.fields(VimeArgs) if "group" in f.metadata]


def _option(f: dataclasses.Field) -> str:
    return f.metadata.get("flag") or "--" + f.name.replace("_", "-")


_OPTIONS = {f.name: _option(f) for f in flag_fields()}
