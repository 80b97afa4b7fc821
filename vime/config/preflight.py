"""What `vime train` checks before it starts anything (Temporal, vLLM, workers).

Found later, a bad prompt file is a rollout worker crash-looping with the message in its log,
and a missing checkpoint directory is vLLM's "Repo id must be in the form..." half a minute in.
Found here, each is one `ConfigError` line on the console before any service starts.
Everything here is cheap: it reads the data files once, streamed
(about 4.5 s of CPU per million JSONL rows), imports the hooks, and looks at directories; it loads no
tokenizer and no model. `vime train` runs it before it imports the launcher (torch, vLLM, Temporal's
workers: 30-70 s on a loaded machine), and checks `--vllm-*` flags (vLLM's parser) only after it,
so a pre-start error is on the console in about 0.4 s of CPU, a few seconds under load.

`preflight(args)` runs every check; each `check_*` function is usable on its own.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
from pathlib import Path
from typing import Any

from vime.config.args import VimeArgs
from vime.config.eval_config import key_path
from vime.config.resolve import HOOK_FLAGS
from vime.errors import ConfigError
from vime.rollout.dataset import check_prompt_file

REQUIRED_FLAGS = ("hf_checkpoint", "prompt_data", "rollout_batch_size", "num_rollout")
"""Flags `vime train` cannot run without (`VimeArgs` attribute names)."""

_HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def checked_args(argv: list[str]) -> VimeArgs:
    """`vime train`'s flags parsed and checked in the order that shows a mistake soonest: vime's own
    flags, then `preflight`, then the `--vllm-*` flags (vLLM's parser imports vLLM). Pass the result
    to `vime.launcher.launch.run_to_end(..., checked=True)`, imported after this returns."""
    from vime.config.args import check_vllm_flags, parse_args

    args = parse_args(argv, vllm_flags=False)
    preflight(args)
    return check_vllm_flags(args)


def preflight(args: Any) -> None:
    """Every check `vime train` can run before starting services; the first problem raises a
    one-line `ConfigError` naming the flag, the path and what to do."""
    check_required(args)
    check_run_dir(args)
    check_hooks(args)
    check_checkpoint(args)
    check_serving(args)
    check_opd(args)
    check_metrics(args)
    check_prompt_data(args)


def check_required(args: Any) -> None:
    """The flags a training run cannot do without are set."""
    missing = [_flag(n) for n in REQUIRED_FLAGS if getattr(args, n) in (None, "")]
    if missing:
        raise ConfigError(f"vime train needs {', '.join(missing)}")


def check_metrics(args: Any) -> None:
    """`--use-wandb` has its package: found later, each step's line would miss W&B with a warning
    in the rollout worker's log that nobody reads."""
    if args.use_wandb and importlib.util.find_spec("wandb") is None:
        raise ConfigError("--use-wandb: the wandb package is not installed: pip install 'vime[wandb]'")


def check_run_dir(args: Any) -> None:
    """No live launch holds `--run-dir`: a second `vime train` on it ends here, in the line the run
    directory lock gives, having read and written nothing of the live run's."""
    from vime.rundir import refuse_if_held

    refuse_if_held(args.run_dir)


def check_hooks(args: Any) -> None:
    """Every hook flag (`--custom-rm-path`, `--rollout-function-path`, ...) imports and is callable;
    the error names the flag, the path and what is missing (`vime.plugins.load_function`). A flag
    left at vime's own default is not imported: that proves nothing and costs a second or more of
    imports (aiohttp, the engine client) before a pre-start error can be shown."""
    from vime.plugins import load_hook

    defaults = {f.name: f.default for f in dataclasses.fields(VimeArgs)}
    for dest in HOOK_FLAGS:
        if getattr(args, dest) != defaults.get(dest):
            load_hook(args, dest)


def _check_model_dir(flag: str, value: str) -> None:
    path = Path(value)
    if not path.exists():
        if _HUB_ID.fullmatch(value):
            raise ConfigError(
                f"{flag} {value!r}: no such directory; it looks like a Hugging Face Hub id, but vime loads "
                f"the model from a local directory: download it first (`huggingface-cli download {value} "
                f"--local-dir <dir>`) and pass that directory"
            )
        raise ConfigError(f"{flag} {value!r}: no such directory; point it at a local HF checkpoint directory")
    if not path.is_dir():
        raise ConfigError(f"{flag} {value!r}: not a directory; point it at a local HF checkpoint directory")
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{flag} {value!r}: no config.json in this directory; point it at an HF checkpoint directory "
            "(the one holding config.json, the weights and the tokenizer)"
        )


def check_checkpoint(args: Any) -> None:
    """`--hf-checkpoint` is a local directory with a config.json (a hub id cannot be downloaded
    here), and so is `--ref-load` when the reference model is loaded (a KL term is on; slime
    scripts pass --ref-load regardless). `--save` and `--load`, when they exist, are directories
    (a missing one is fine: a new run writes it)."""
    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is not set; point it at a local HF checkpoint directory")
    _check_model_dir("--hf-checkpoint", args.hf_checkpoint)
    if args.ref_load and (args.use_kl_loss or args.kl_coef > 0):
        _check_model_dir("--ref-load", args.ref_load)
    for flag, value in (("--save", args.save), ("--load", args.load)):  # --load defaults to --save
        if value and Path(value).exists() and not Path(value).is_dir():
            raise ConfigError(
                f"{flag} {value!r}: not a directory; checkpoints are directories: pass a directory "
                "(a missing one is created)"
            )


def check_serving(args: Any) -> None:
    """`--vllm-config` describes servers vime starts: it cannot go with servers the user runs unless
    `--vllm-model-urls` names the running servers of its models (then the rollout model's is the
    router generate calls), and each model it serves is a checkpoint directory."""
    if args.vllm_config is None:
        return
    if (args.vllm_router_ip or args.vllm_router_port) and not args.vllm_model_urls:
        raise ConfigError(f"--vllm-config {args.vllm_config!r} describes servers vime starts, --vllm-router-ip/"
                          "--vllm-router-port point at servers you run: pass one of them (or name every model's "
                          "running servers with --vllm-model-urls NAME=URL)")
    from vime.engine.topology import topology_of

    topology = topology_of(args)
    for i, model in enumerate(topology.models):
        _check_model_dir(f"--vllm-config {args.vllm_config}: vllm[{i}].model_path", model.model_path)
    if topology.policy is None:
        raise ConfigError(f"--vllm-config {args.vllm_config}: no model takes the trainer's weights; serve "
                          "--hf-checkpoint as one of them (its update_weights defaults to true)")


def check_opd(args: Any) -> None:
    """`--use-opd` has a teacher to score the student's tokens, a reward function that stores its
    log-probs, and, where the teacher's checkpoint is known (`--vllm-config`), the student's
    tokenizer: the teacher reads the student's token ids, so one id must mean one token in both."""
    if not args.use_opd:
        return
    if args.opd_kl_coef < 0:
        raise ConfigError(f"--opd-kl-coef must be >= 0 (the weight of the reverse KL to the teacher), got "
                          f"{args.opd_kl_coef}")
    if args.custom_rm_path is None:
        raise ConfigError("--use-opd: the teacher's log-probs are fetched by the reward function; add --custom-rm-path "
                          "vime.rollout.on_policy_distillation.reward_func (or a function of yours that calls its "
                          "score_with_teacher)")
    from vime.rollout.on_policy_distillation import TEACHER, teacher_url

    teacher = None
    if args.vllm_config is not None:
        from vime.engine.topology import topology_of

        teacher = next((m for m in topology_of(args).models if m.name == TEACHER), None)
        if teacher is not None and teacher.update_weights:
            raise ConfigError(f"--vllm-config {args.vllm_config}: the model named {TEACHER!r} takes the trainer's "
                              "weights; a teacher is frozen: serve its own checkpoint with update_weights: false")
    if teacher is None and teacher_url(args) is None:
        raise ConfigError(f"--use-opd: no teacher to score the student's tokens; add a model named {TEACHER!r} with "
                          "update_weights: false to --vllm-config (see examples/on_policy_distillation), or pass "
                          f"--vllm-model-urls {TEACHER}=http://HOST:PORT")
    if teacher is not None and args.hf_checkpoint:
        check_same_tokenizer(args.hf_checkpoint, teacher.model_path)


def check_same_tokenizer(student: str, teacher: str) -> None:
    """The teacher's vocabulary is the student's: the same embedding size and, where both ship a
    `tokenizer.json`, the same token for every id (read as JSON: no tokenizer is loaded)."""
    import json

    def vocab_size(path: str) -> Any:
        try:
            return json.loads((Path(path) / "config.json").read_text()).get("vocab_size")
        except (OSError, ValueError):
            return None

    what = (f"--use-opd: the teacher {teacher!r} and the student --hf-checkpoint {student!r} have different "
            "vocabularies ({}); the teacher scores the student's token ids, so it must use the student's tokenizer "
            "(distil from a teacher of the same family, or retokenize)")
    sizes = vocab_size(student), vocab_size(teacher)
    if None not in sizes and sizes[0] != sizes[1]:
        raise ConfigError(what.format(f"vocab_size {sizes[1]} vs {sizes[0]}"))
    files = [Path(p) / "tokenizer.json" for p in (student, teacher)]
    if not all(f.is_file() for f in files):
        return
    try:
        tables = [_token_table(json.loads(f.read_text())) for f in files]
    except (OSError, ValueError):
        return
    if tables[0] != tables[1]:
        token_id = min(i for i in set(tables[0]) | set(tables[1]) if tables[0].get(i) != tables[1].get(i))
        raise ConfigError(what.format(f"id {token_id} is {tables[1].get(token_id)!r} in the teacher, "
                                      f"{tables[0].get(token_id)!r} in the student"))


def _token_table(tokenizer_json: dict) -> dict[int, str]:
    table = {int(i): str(t) for t, i in (tokenizer_json.get("model", {}).get("vocab") or {}).items()}
    table.update({int(t["id"]): str(t["content"]) for t in tokenizer_json.get("added_tokens") or []})
    return table


def check_prompt_data(args: Any) -> None:
    """Every record of `--prompt-data` (and of each `--eval-prompt-data` set) reads as a prompt:
    the file exists and is .jsonl or .parquet, is not empty, its rows parse, and each has
    `--input-key` (and `--label-key` when set; for eval sets, the `--eval-*-key` flags) holding a prompt that is not empty, with
    `--metadata-key` / `--tool-key` of the right type when present. `--prompt-data` has at least
    the `--rollout-batch-size` prompts one step takes.

    Files a user hook reads instead of vime are not checked: `--prompt-data` under a custom
    `--data-source-path`, eval sets under a custom eval (or rollout) function.
    """
    keys = {"input_key": args.input_key, "label_key": args.label_key, "metadata_key": args.metadata_key,
            "tool_key": args.tool_key}
    if args.data_source_path is None:
        if not args.prompt_data:
            raise ConfigError("--prompt-data is not set; point it at a .jsonl or .parquet prompt file")
        prompts = check_prompt_file(args.prompt_data, flag="--prompt-data", **keys)
        check_enough_prompts(args, prompts)
    check_eval_sets(args)


def check_eval_sets(args: Any) -> None:
    """Each eval set's records read as prompts with the set's own keys (`--eval-config`), else the
    eval keys; each set's own reward type and hooks exist. Files a custom eval (or rollout)
    function reads itself are not checked."""
    from vime.rollout.eval_data import eval_keys, eval_set_args, eval_sets

    data = args.eval_config_data
    if data is not None:
        for i, entry in enumerate(data["datasets"]):
            _check_set_reward(args, entry, key_path(data, i))
    if not args.eval_prompt_data or (args.eval_function_path or args.rollout_function_path) != \
            VimeArgs.rollout_function_path:
        return
    for i, (name, path) in enumerate(eval_sets(args)):
        flag = f"{key_path(data, i)}.path" if data is not None else "--eval-prompt-data"
        check_prompt_file(path, flag=flag, **eval_keys(eval_set_args(args, name)))


def _check_set_reward(args: Any, entry: dict[str, Any], where: str) -> None:
    """An `--eval-config` set's `rm_type` is one vime has, and its hooks import."""
    from vime.plugins import load_function
    from vime.rollout.rewards import BUILTIN_RMS

    rm_type = entry.get("rm_type")
    if rm_type == "remote_rm" and not args.rm_url:
        raise ConfigError(f"{where}.rm_type: remote_rm needs --rm-url (the reward service)")
    if rm_type is not None and rm_type != "remote_rm" and rm_type.removeprefix("boxed_") not in BUILTIN_RMS:
        raise ConfigError(f"{where}.rm_type: {rm_type!r} is not a built-in reward; use one of "
                          f"{', '.join(sorted(BUILTIN_RMS))}, remote_rm, a boxed_ prefix, or custom_rm_path")
    for key in ("custom_rm_path", "custom_generate_function_path"):
        if entry.get(key) is not None:
            load_function(entry[key], f"{where}.{key}")


def check_enough_prompts(args: Any, prompts: int) -> None:
    """A step takes `--rollout-batch-size` distinct prompts. With fewer in the file, positions
    wrap into the next epoch inside one step and the step trains on copies of the same prompts
    (slime's data source does the same, silently); with as many or more, epochs follow one
    another over the steps (`vime.rollout.data_source`), however many `--num-rollout` asks for."""
    batch = args.rollout_batch_size
    if batch and prompts < batch:
        what = "prompt" if prompts == 1 else "prompts"
        raise ConfigError(f"--prompt-data {args.prompt_data} has {prompts} {what}; one step takes --rollout-batch-size "
                          f"{batch}: add prompts or lower it")
