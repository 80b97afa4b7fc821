"""`vime` flags: slime's names and defaults, `--vllm-*` / `--router-*` forwarding, clear errors.

The forwarding tests build vLLM's real `vllm serve` parser (importing vLLM takes seconds; it is
built once per process and shared by every test here).
"""

from __future__ import annotations

import functools
import importlib.util

import pytest

import vime.config.forward as forward
from vime.config.args import VimeArgs, build_parser, parse_args, parse_args_or_exit
from vime.errors import ConfigError

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")
needs_router = pytest.mark.skipif(importlib.util.find_spec("vllm_router") is None, reason="vllm-router not installed")


def error_of(argv: list[str]) -> str:
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    return str(info.value)


# ---------------------------------------------------------------- slime's names and defaults

SLIME_DEFAULTS = {
    "hf_checkpoint": None,
    "prompt_data": None,
    "input_key": "input",
    "label_key": None,
    "metadata_key": "metadata",
    "tool_key": "tools",
    "apply_chat_template": False,
    "rollout_batch_size": None,
    "n_samples_per_prompt": 1,
    "num_rollout": None,
    "num_epoch": None,
    "rollout_max_response_len": None,
    "rollout_max_prompt_len": None,
    "rollout_temperature": 1.0,
    "rollout_top_p": 1.0,
    "rollout_top_k": -1,
    "rollout_stop": None,
    "rollout_stop_token_ids": None,
    "rollout_seed": 42,
    "rollout_shuffle": False,
    "rollout_function_path": "vime.rollout.vllm_rollout.generate_rollout",
    "custom_generate_function_path": None,
    "custom_rm_path": None,
    "group_rm": False,
    "rm_type": None,
    "rm_url": None,
    "eval_function_path": None,
    "eval_prompt_data": None,
    "eval_interval": None,
    "dynamic_sampling_filter_path": None,
    "buffer_filter_path": None,
    "data_source_path": None,
    "save": None,
    "save_interval": None,
    "load": None,
    "ref_load": None,
    "n_samples_per_eval_prompt": 1,
    "seed": 1234,
    "lr": 1e-6,
    "clip_grad": 1.0,
    "micro_batch_size": 1,
    "global_batch_size": None,
    "advantage_estimator": "grpo",
    "eps_clip": 0.2,
    "eps_clip_high": 0.2,
    "kl_coef": 0.0,
    "use_kl_loss": False,
    "kl_loss_coef": 0.0,
    "kl_loss_type": "k1",
    "entropy_coef": 0.0,
    "use_tis": False,
    "tis_clip": 2.0,
    "tis_clip_low": 0.0,
    "eps_clip_c": None,
    "normalize_advantages": False,
    "disable_grpo_std_normalization": False,
    "use_opd": False,
    "opd_type": None,
    "opd_kl_coef": 1.0,
    "loss_type": "policy_loss",
    "gradient_checkpointing": False,
    "max_tokens_per_gpu": None,
    "max_staleness": 0,
    "rollout_task_queue": "vime-rollout",
    "sandbox_task_queue": "vime-sandbox",
    "temporal_address": None,
    "vllm_router_ip": None,
    "vllm_router_port": None,
    "vllm_num_servers": 1,
    "router_policy": "cache_aware",
    "vllm_server_args": [],
    "router_args": [],
}


def test_defaults_follow_slime():
    args = parse_args([])
    assert isinstance(args, VimeArgs)
    assert {name: getattr(args, name) for name in SLIME_DEFAULTS} == SLIME_DEFAULTS


def test_slime_flags_parse_into_typed_attributes():
    args = parse_args([
        "--hf-checkpoint", "/models/qwen", "--prompt-data", "train.jsonl", "--input-key", "prompt",
        "--label-key", "answer", "--apply-chat-template", "--rollout-batch-size", "32",
        "--n-samples-per-prompt", "8", "--rollout-max-response-len", "1024", "--rollout-temperature", "0.7",
        "--rollout-stop", "</answer>", "<|im_end|>", "--rollout-stop-token-ids", "151643", "151645",
        "--custom-rm-path", "my_task.reward.rm", "--group-rm", "--advantage-estimator", "gspo",
        "--eps-clip", "0.1", "--use-kl-loss", "--kl-loss-coef", "0.01", "--kl-loss-type", "low_var_kl",
        "--apply-chat-template-kwargs", '{"enable_thinking": false}', "--disable-grpo-std-normalization",
    ])
    assert args.hf_checkpoint == "/models/qwen"
    assert (args.input_key, args.label_key, args.apply_chat_template) == ("prompt", "answer", True)
    assert (args.rollout_batch_size, args.n_samples_per_prompt) == (32, 8)
    assert args.rollout_temperature == 0.7
    assert args.rollout_stop == ["</answer>", "<|im_end|>"]
    assert args.rollout_stop_token_ids == [151643, 151645]
    assert (args.custom_rm_path, args.group_rm) == ("my_task.reward.rm", True)
    assert (args.advantage_estimator, args.eps_clip, args.eps_clip_high) == ("gspo", 0.1, 0.1)
    assert (args.use_kl_loss, args.kl_loss_coef, args.kl_loss_type) == (True, 0.01, "low_var_kl")
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    assert args.disable_grpo_std_normalization is True


def test_defaults_that_follow_other_flags():
    args = parse_args(["--rollout-batch-size", "16", "--n-samples-per-prompt", "4", "--save", "/ckpt"])
    assert args.global_batch_size == 64, "one optimizer step per rollout step, as in slime"
    assert args.over_sampling_batch_size == 16
    assert args.load == "/ckpt", "a run resumes from its own checkpoints"
    assert args.eps_clip_high == args.eps_clip


def test_explicit_values_beat_derived_defaults():
    args = parse_args([
        "--rollout-batch-size", "16", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
        "--save", "/ckpt", "--load", "/other", "--eps-clip-high", "0.28", "--over-sampling-batch-size", "24",
    ])
    assert (args.global_batch_size, args.load, args.eps_clip_high, args.over_sampling_batch_size) == (
        32, "/other", 0.28, 24,
    )


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--rollout-batch-size", "abc"], "--rollout-batch-size: invalid int value: 'abc'"),
        (["--rollout-batch-size", "0"], "--rollout-batch-size must be a positive integer, got 0"),
        (["--advantage-estimator", "ppo2"], "--advantage-estimator: invalid choice: 'ppo2'"),
        (["--rollout-temperature", "0"], "--rollout-temperature must be > 0"),
        (["--rollout-top-p", "1.5"], "--rollout-top-p must be in (0, 1]"),
        (["--rollout-batch-size", "4", "--global-batch-size", "3"], "--global-batch-size 3 must divide"),
        (["--save-interval", "10"], "--save-interval needs --save"),
        (["--kl-coef", "0.1", "--kl-loss-coef", "0.1"], "only one of --kl-coef"),
        (["--advantage-estimator", "reinforce_plus_plus"], "needs --normalize-advantages"),
        (["--eval-interval", "5"], "--eval-interval needs --eval-prompt-data"),
        (["--rm-type", "remote_rm"], "--rm-type remote_rm needs --rm-url"),
        (["--custom-rm-path", "reward"], "--custom-rm-path 'reward': expected a dotted path"),
        (["--vllm-router-port", "70000"], "--vllm-router-port must be a TCP port"),
        (["--apply-chat-template-kwargs", "{oops"], "--apply-chat-template-kwargs: invalid JSON '{oops'"),
        (["--rollout-batch-size"], "--rollout-batch-size: expected one argument"),
        (["--n-samples-per-eval-prompt", "0"], "--n-samples-per-eval-prompt must be a positive integer, got 0"),
        (["--eps-clip-c", "0.5"], "--eps-clip-c must be > 1"),
        (["--tis-clip-low", "3"], "--tis-clip-low 3.0 / --tis-clip 2.0"),
        (["--tis-clip-low", "-1"], "--tis-clip-low must be >= 0"),
        (["--mis-low", "2", "--mis-high", "1"], "--mis-low 2.0 / --mis-high 1.0"),
        (["--max-failed-sample-ratio", "1.5"], "--max-failed-sample-ratio must be in [0, 1]"),
        (["--custom-rm-timeout", "-1"], "--custom-rm-timeout must be >= 0"),
        (["--custom-generate-timeout", "-5"], "--custom-generate-timeout must be >= 0"),
    ],
)
def test_bad_values_name_the_flag(argv, expected):
    assert expected in error_of(argv)


def test_slime_flags_vime_reads_are_real_flags():
    args = parse_args(["--ref-load", "/models/ref", "--n-samples-per-eval-prompt", "4", "--eps-clip-c", "3",
                       "--tis-clip-low", "0.5"])
    assert (args.ref_load, args.n_samples_per_eval_prompt, args.eps_clip_c, args.tis_clip_low) == (
        "/models/ref", 4, 3.0, 0.5)


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--kl-coef", "0.1"],
         "--kl-coef 0.1 shapes the reward of the REINFORCE++ estimators; --advantage-estimator grpo ignores it"),
        (["--kl-loss-coef", "0.1"], "--kl-loss-coef 0.1 has no effect without --use-kl-loss: add --use-kl-loss"),
    ],
)
def test_algorithm_flags_that_would_be_ignored_are_refused(argv, expected):
    assert expected in error_of(argv)


TRAIN = ["--rollout-batch-size", "4", "--num-rollout", "10"]


@pytest.mark.parametrize(
    "estimator", ["grpo", "gspo", "reinforce_plus_plus_baseline"],
)
def test_a_group_estimator_with_one_sample_per_prompt_is_refused_saying_why(estimator):
    message = error_of([*TRAIN, "--advantage-estimator", estimator, "--normalize-advantages"])
    assert f"--advantage-estimator {estimator} compares the responses of one prompt" in message
    assert "with --n-samples-per-prompt 1 every advantage is 0 and nothing trains" in message
    assert "use --n-samples-per-prompt 2 or more, or --advantage-estimator reinforce_plus_plus" in message


@pytest.mark.parametrize(
    "argv",
    [
        [*TRAIN, "--n-samples-per-prompt", "2"],
        [*TRAIN, "--advantage-estimator", "reinforce_plus_plus", "--normalize-advantages"],
        [*TRAIN, "--loss-type", "sft_loss"],
        ["--rollout-batch-size", "4"],  # generating rollouts only (a script, evaluation): no advantages
        ["--num-epoch", "1"],
    ],
    ids=["two-samples", "reinforce_plus_plus", "sft-loss", "generation-only", "no-rollout-batch"],
)
def test_one_sample_per_prompt_is_fine_where_nothing_compares_the_group(argv):
    assert parse_args(argv).n_samples_per_prompt in (1, 2)


def test_unknown_flag_is_named_with_the_closest_known_flag():
    message = error_of(["--rollout-bach-size", "32"])
    assert message.startswith("unknown flag --rollout-bach-size")
    assert "did you mean --rollout-batch-size?" in message


def test_flags_are_not_abbreviated():
    assert "unknown flag --rollout-batch" in error_of(["--rollout-batch", "32"])


def test_positional_arguments_are_rejected():
    assert "unexpected argument 'train.jsonl'" in error_of(["train.jsonl"])


def test_help_lists_the_groups(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    for group in ("data:", "rollout:", "reward:", "training:", "algorithm:", "checkpoint:", "orchestration:",
                  "vLLM:", "router:"):
        assert f"\n{group}\n" in out
    assert "--vllm-<flag>" in out and "--router-<flag>" in out
    assert "--rollout-batch-size" in out and "(default: 42)" in out


def test_command_line_errors_are_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as info:
        parse_args_or_exit(["--rollout-bach-size", "8"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("vime: error: unknown flag --rollout-bach-size")


# ---------------------------------------------------------------- run identity and config files


def test_the_parsed_config_is_read_only_but_a_hook_may_keep_its_own_attributes():
    """Hooks get the run's config as slime's `args`; changing a field in one worker would run a config
    no other process and no stored record agrees with, so it raises and names the flag."""
    import dataclasses

    args = parse_args(["--rollout-batch-size", "4"])
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"args.rollout_batch_size is the run's config .*"
                                                              r"set --rollout-batch-size on the command line"):
        args.rollout_batch_size = 8
    with pytest.raises(AttributeError, match="args.vllm_server_args .* it is derived from the flags"):
        args.vllm_server_args = []
    args.my_cache = {"seen": 1}  # not a flag: the hook's own
    assert (args.rollout_batch_size, args.my_cache) == (4, {"seen": 1})
    changed = args.replace(rollout_batch_size=8)  # a changed copy, read-only too
    assert (changed.rollout_batch_size, args.rollout_batch_size) == (8, 4)
    with pytest.raises(AttributeError):
        changed.rollout_batch_size = 2


def test_a_config_read_back_from_the_store_is_read_only_too():
    from vime.config.run_args import args_from_stored, stored_config

    args = args_from_stored(stored_config(parse_args(["--rollout-batch-size", "4"])))
    assert args.rollout_batch_size == 4
    with pytest.raises(AttributeError, match="read-only"):
        args.rollout_batch_size = 8


def test_run_dir_store_and_run_id_follow_each_other(tmp_path):
    args = parse_args(["--run-dir", str(tmp_path / "exp1")])
    assert args.run_id == "exp1"
    assert args.store_url == f"sqlite:///{tmp_path / 'exp1' / 'vime.db'}"
    args = parse_args(["--run-id", "exp2"])
    assert args.run_dir.endswith("/runs/exp2")


def test_argv_reparses_to_the_same_run_in_another_directory(tmp_path, monkeypatch):
    """Workers receive `args.argv`; a generated run id and a relative run dir must survive the trip."""
    args = parse_args(["--rollout-batch-size", "8", "--run-dir", "rel/dir"])
    monkeypatch.chdir(tmp_path)
    again = parse_args(args.argv)
    assert {k: v for k, v in again.to_dict().items() if k != "argv"} == {
        k: v for k, v in args.to_dict().items() if k != "argv"
    }
    fresh = parse_args([])
    assert parse_args(fresh.argv).run_id == fresh.run_id


def test_vllm_config_is_read_and_checked(tmp_path):
    good = tmp_path / "servers.yaml"
    good.write_text("vllm:\n  - name: actor\n    server_groups: [{worker_type: regular, num_gpus: 2}]\n")
    assert parse_args(["--vllm-config", str(good), "--hf-checkpoint", str(tmp_path)]).vllm_config_data == {
        "vllm": [{"name": "actor", "server_groups": [{"worker_type": "regular", "num_gpus": 2}]}]}

    assert "cannot read it" in error_of(["--vllm-config", str(tmp_path / "missing.yaml")])
    broken = tmp_path / "broken.yaml"
    broken.write_text("vllm: [unclosed\n")
    assert "not valid YAML" in error_of(["--vllm-config", str(broken)])
    listing = tmp_path / "list.yaml"
    listing.write_text("- a\n- b\n")
    assert "expected a YAML mapping" in error_of(["--vllm-config", str(listing)])


def test_vimes_own_flags_do_not_need_vllm(monkeypatch):
    """--vllm-router-*, --vllm-num-servers, --vllm-config and --router-policy are vime's: no vLLM import."""
    monkeypatch.setattr(forward, "VLLM_PARSER_SOURCES", (("no_such_vllm.cli_args", "make_arg_parser"),))
    monkeypatch.setattr(forward, "vllm_actions", functools.cache(forward.vllm_actions.__wrapped__))
    args = parse_args(["--vllm-router-ip", "10.0.0.2", "--vllm-router-port=8000", "--vllm-num-servers", "2"])
    assert (args.vllm_router_ip, args.vllm_router_port, args.vllm_num_servers) == ("10.0.0.2", 8000, 2)
    assert args.vllm_server_args == []


def test_vllm_flags_without_vllm_say_what_to_install(monkeypatch):
    monkeypatch.setattr(forward, "VLLM_PARSER_SOURCES", (("no_such_vllm.cli_args", "make_arg_parser"),))
    monkeypatch.setattr(forward, "vllm_actions", functools.cache(forward.vllm_actions.__wrapped__))
    message = error_of(["--vllm-max-model-len", "1024"])
    assert "--vllm-* server flags need vLLM" in message
    assert "vime[cpu]" in message and "vime[gpu]" in message


def test_router_flags_without_router_say_what_to_install(monkeypatch):
    monkeypatch.setattr(forward, "ROUTER_PARSER_SOURCE", ("no_such_router.router_args", "RouterArgs"))
    monkeypatch.setattr(forward, "router_actions", functools.cache(forward.router_actions.__wrapped__))
    monkeypatch.setattr(forward, "router_policies", functools.cache(forward.router_policies.__wrapped__))
    assert parse_args(["--router-policy", "consistent_hash"]).router_policy == "consistent_hash"
    message = error_of(["--router-cache-threshold", "0.5"])
    assert "--router-* flags need vllm-router" in message and "vime[cpu]" in message


# ---------------------------------------------------------------- --vllm-* forwarding


@needs_vllm
def test_vllm_flags_are_forwarded_as_server_tokens_and_nothing_else():
    args = parse_args([
        "--rollout-batch-size", "4",
        "--vllm-max-model-len", "1024", "--vllm-gpu-memory-utilization", "0.3", "--vllm-enforce-eager",
    ])
    assert args.vllm_server_args == ["--max-model-len", "1024", "--gpu-memory-utilization", "0.3", "--enforce-eager"]
    assert args.router_args == []
    assert not hasattr(args, "max_model_len") and not hasattr(args, "enforce_eager")


@needs_vllm
@pytest.mark.parametrize(
    "argv, tokens",
    [
        (["--vllm-max-model-len=2k"], ["--max-model-len", "2k"]),  # vLLM's own type accepts 2k; kept raw
        (["--vllm-no-enable-prefix-caching"], ["--no-enable-prefix-caching"]),
        (["--vllm-served-model-name", "policy", "actor"], ["--served-model-name", "policy", "actor"]),
        (["--vllm-hf-overrides", '{"rope_theta": 10000}'], ["--hf-overrides", '{"rope_theta": 10000}']),
        (["--vllm-compilation-config", '{"mode": 3}'], ["--compilation-config", '{"mode": 3}']),
        (["--vllm-compilation-config.mode", "3"], ["--compilation-config.mode", "3"]),
        (["--vllm-compilation-config.mode=3"], ["--compilation-config.mode=3"]),
        (["--vllm-seed", "-1"], ["--seed=-1"]),  # a leading dash stays attached to its flag
        (["--vllm-enable-auto-tool-choice", "--vllm-tool-call-parser", "hermes"],
         ["--enable-auto-tool-choice", "--tool-call-parser", "hermes"]),
        (["--vllm-max-lora-rank", "16"], ["--max-lora-rank", "16"]),
        (["--vllm-hf-token"], ["--hf-token"]),
    ],
)
def test_vllm_flag_forms_are_forwarded_verbatim(argv, tokens):
    assert parse_args(argv).vllm_server_args == tokens


@needs_vllm
@pytest.mark.parametrize(
    "argv, expected",
    [
        (["--vllm-max-model-len", "abc"], "--vllm-max-model-len: invalid value 'abc'"),
        (["--vllm-dtype", "nonsense"], "--vllm-dtype: invalid choice 'nonsense' (choose from auto"),
        (["--vllm-gpu-memory-utilization", "most"], "--vllm-gpu-memory-utilization: invalid value 'most'"),
        (["--vllm-max-lora-rank", "7"], "--vllm-max-lora-rank: invalid choice '7'"),
        (["--vllm-compilation-config", "{not json"], "--vllm-compilation-config: invalid value '{not json'"),
        (["--vllm-max-model-len"], "--vllm-max-model-len: expected one argument"),
    ],
)
def test_bad_vllm_values_fail_at_parse_time_naming_the_flag(argv, expected):
    message = error_of(argv)
    assert message.startswith(expected)
    assert "\n" not in message


@needs_vllm
def test_unknown_vllm_flag_gets_a_suggestion():
    message = error_of(["--vllm-max-modle-len", "1024"])
    assert message.startswith("unknown flag --vllm-max-modle-len; vLLM has no such flag")
    assert "did you mean --vllm-max-model-len?" in message


@needs_vllm
@pytest.mark.parametrize(
    "flag, value, hint",
    [("--vllm-model", "Qwen/Qwen3-4B", "--hf-checkpoint"), ("--vllm-port", "8000", "--vllm-router-port")],
)
def test_flags_vime_sets_per_server_are_refused(flag, value, hint):
    message = error_of([flag, value])
    assert message.startswith(f"{flag} is not forwarded") and hint in message


@needs_vllm
def test_vimes_own_vllm_flags_take_precedence(tmp_path):
    """vLLM's `--config` would be `--vllm-config`; vime's YAML flag keeps that name."""
    config = tmp_path / "servers.yaml"
    config.write_text("vllm: [{name: actor, server_groups: [{worker_type: regular, num_gpus: 1}]}]\n")
    args = parse_args(["--vllm-config", str(config), "--vllm-router-port", "9000", "--vllm-enforce-eager",
                       "--hf-checkpoint", str(tmp_path)])
    assert args.vllm_config_data["vllm"][0]["name"] == "actor" and args.vllm_router_port == 9000
    assert args.vllm_server_args == ["--enforce-eager"]


@needs_vllm
def test_the_workers_of_vime_train_take_its_checked_vllm_flags_without_importing_vllm(monkeypatch):
    """The launcher's parse checked every --vllm-* flag with vLLM's parser; its workers get the
    same argv and the same server tokens without building that parser again."""
    argv = ["--vllm-max-model-len", "512", "--lr", "1e-3", "--vllm-enforce-eager", "--vllm-router-ip", "10.0.0.5",
            "--vllm-gpu-memory-utilization=0.3", "--vllm-num-servers", "1"]
    launcher = parse_args(argv)
    monkeypatch.setenv(forward.CHECKED_ENV, "1")
    monkeypatch.setattr(forward, "VLLM_PARSER_SOURCES", (("no_such_vllm.cli_args", "make_arg_parser"),))
    monkeypatch.setattr(forward, "vllm_actions", functools.cache(forward.vllm_actions.__wrapped__))
    worker = parse_args(argv)
    assert worker.vllm_server_args == launcher.vllm_server_args == [
        "--max-model-len", "512", "--enforce-eager", "--gpu-memory-utilization", "0.3"]
    assert (worker.vllm_router_ip, worker.vllm_num_servers, worker.lr) == ("10.0.0.5", 1, 1e-3)


@needs_vllm
def test_vllm_parser_is_built_once_per_process():
    build_parser(vllm=True)
    first = forward.vllm_parser_build_seconds()
    build_parser(vllm=True)
    assert forward.vllm_parser_build_seconds() == first


# ---------------------------------------------------------------- --router-* forwarding


@needs_router
def test_router_flags_are_forwarded_as_router_tokens():
    args = parse_args(["--router-policy", "consistent_hash", "--router-balance-abs-threshold", "32",
                       "--router-disable-retries", "--router-temperature", "0.5"])
    assert args.router_policy == "consistent_hash"
    assert args.router_args == [
        "--policy", "consistent_hash", "--balance-abs-threshold", "32", "--disable-retries",
        "--router-temperature", "0.5",  # the router's own --router-temperature is not doubled
    ]
    assert args.vllm_server_args == []


@needs_router
def test_router_policy_choices_come_from_the_router():
    from vllm_router.router_args import RouterArgs

    assert "consistent_hash" in forward.router_policies()
    assert RouterArgs.policy == parse_args([]).router_policy == "cache_aware"
    assert "--router-policy: invalid choice: 'sticky'" in error_of(["--router-policy", "sticky"])


@needs_router
def test_bad_and_unknown_router_flags():
    assert error_of(["--router-cache-threshold", "high"]).startswith("--router-cache-threshold: invalid value 'high'")
    message = error_of(["--router-balance-abs-treshold", "3"])
    assert "vllm-router has no such flag" in message and "did you mean --router-balance-abs-threshold?" in message


@needs_router
def test_router_listen_address_is_vimes():
    """Where the router listens is --vllm-router-ip/--vllm-router-port; the router's --host/--port are not exposed."""
    assert error_of(["--router-port", "30000"]).startswith("unknown flag --router-port")


def test_upstreams_fully_async_rollout_function_selects_the_durable_fully_async_mode():
    args = parse_args(["--rollout-function-path", "vime.rollout.fully_async_rollout.generate_rollout_fully_async"])
    assert args.fully_async is True
    assert args.rollout_function_path == parse_args([]).rollout_function_path  # per-group workflows, durable
    assert (args.staleness_control, args.max_concurrent_rollouts) == ("pace", None)


def test_fully_async_with_a_rollout_function_that_owns_whole_steps_is_refused():
    with pytest.raises(ConfigError, match="--fully-async .* --rollout-function-path my.steps.fn"):
        parse_args(["--fully-async", "--rollout-function-path", "my.steps.fn"])
    with pytest.raises(ConfigError, match="--max-concurrent-rollouts must be a positive integer"):
        parse_args(["--fully-async", "--max-concurrent-rollouts", "0"])

