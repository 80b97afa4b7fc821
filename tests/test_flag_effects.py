"""Every flag vime's parser declares changes behaviour, and a test shows it, or is refused with its reason.

A flag that parses and then does nothing is a trap: the user believes they configured something.
So each declared flag (`vime.config.args.flag_fields()`) is in exactly one of these tables:

- `test_flag_math.FLAGS`: the algorithm flags, each flipped through the real loss and advantages;
- `EXERCISED`: the test (`file::function`) that runs the flag's effect; that test must exist
  and name the flag (its option or its dest);
- `REFUSED`: a command line with the flag that `parse_args` refuses, and the reason it gives.

(The debt list of flags read but not yet shown to work is gone: its last two, `--eval-interval`
and `--eval-function-path`, came with evaluation.)

A newly declared flag that is in none of them fails `test_every_declared_flag_is_accounted_for`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.test_flag_math import FLAGS as MATH_FLAGS
from vime.config.args import _option, flag_fields, parse_args
from vime.errors import ConfigError
from vime.train.trainer import lr_lambda

ROOT = Path(__file__).resolve().parents[1]

EXERCISED = {
    "--prompt-data": "test_bad_input.py::test_a_prompt_file_too_short_for_one_step_is_one_line_before_anything_starts",
    "--input-key": "test_long_lived_workers.py::test_a_starting_run_s_flags_are_checked_as_vime_train_checks_them",
    "--label-key": "test_preflight.py::test_a_good_run_passes_every_check",
    "--metadata-key": "test_rollout_data.py::test_metadata_key_and_tool_key_name_the_columns_that_become_metadata_and_tools",
    "--tool-key": "test_rollout_data.py::test_metadata_key_and_tool_key_name_the_columns_that_become_metadata_and_tools",
    "--apply-chat-template-kwargs": "test_rollout_data.py::test_apply_chat_template_kwargs_reach_the_template_of_every_rendered_prompt",
    "--apply-chat-template": "test_preflight.py::test_a_chat_prompt_without_content_is_empty_judged_before_any_template",
    "--num-rollout": "test_cli.py::test_a_bad_plugin_path_fails_at_start_naming_path_and_module",
    "--num-epoch": "test_preflight.py::test_as_many_prompts_as_one_step_takes_train_over_epochs",
    "--data-source-path": "test_plugins.py::test_colon_path_reaches_attributes_of_objects",
    "--eval-prompt-data": "test_preflight.py::test_eval_sets_are_checked_too",
    "--eval-config": "test_eval_command.py::test_vime_eval_of_an_hf_checkpoint_on_an_eval_config_gives_each_set_its_own_samples_and_reward",
    "--sft-data": "test_sft.py::test_sft_teaches_the_tool_call_answers_and_the_saved_model_reproduces_each_one",
    "--hf-checkpoint": "test_bad_input.py::test_a_launch_on_a_live_runs_directory_is_refused_in_one_line_and_writes_nothing",
    "--rollout-function-path": "test_fully_async.py::test_the_fully_async_example_learns_when_started_by_upstreams_rollout_function",
    "--custom-generate-function-path": "test_bad_input.py::test_a_generate_hook_that_fails_on_every_sample_stops_the_run_with_its_error",
    "--custom-generate-timeout": "test_hook_failures.py::test_a_generate_hook_that_hangs_times_out_and_the_sample_fails",
    "--max-failed-sample-ratio": "test_hook_failures.py::test_a_step_above_the_bound_stops_with_the_first_error_and_the_numbers",
    "--rollout-batch-size": "test_bad_input.py::test_a_prompt_file_too_short_for_one_step_is_one_line_before_anything_starts",
    "--n-samples-per-prompt": "test_bad_input.py::test_one_sample_per_prompt_with_grpo_is_refused_with_the_reason",
    "--over-sampling-batch-size": "test_rollout_generate.py::test_generate_rollout_keeps_groups_with_reward_spread",
    "--rollout-max-response-len": "test_chaos.py::test_a_run_survives_sigterm_and_each_of_its_parts_dying_and_trains_every_sample_on_policy",
    "--rollout-max-prompt-len": "test_rollout_data.py::test_max_prompt_len_drops_long_prompts_and_refuses_to_drop_all",
    "--rollout-temperature": "test_rollout_data.py::test_sampling_params_use_vllms_names_and_a_seed_per_sample",
    "--rollout-top-p": "test_rollout_data.py::test_sampling_params_use_vllms_names_and_a_seed_per_sample",
    "--rollout-top-k": "test_rollout_data.py::test_sampling_params_use_vllms_names_and_a_seed_per_sample",
    "--rollout-stop": "test_coding_agent_rollout.py::test_a_claude_code_rollout_runs_the_cli_in_the_sandbox_and_stores_its_session",
    "--rollout-stop-token-ids": "test_coding_agent_rollout.py::test_a_claude_code_rollout_runs_the_cli_in_the_sandbox_and_stores_its_session",
    "--rollout-skip-special-tokens": "test_rollout_data.py::test_sampling_params_use_vllms_names_and_a_seed_per_sample",
    "--rollout-seed": "test_coding_agent_rollout.py::test_a_claude_code_rollout_runs_the_cli_in_the_sandbox_and_stores_its_session",
    "--rollout-shuffle": "test_rollout_data.py::test_positions_cover_every_prompt_once_per_epoch_in_a_seeded_order",
    "--dynamic-sampling-filter-path": "test_rollout_generate.py::test_generate_rollout_keeps_groups_with_reward_spread",
    "--buffer-filter-path": "test_plugins.py::test_load_hook_is_none_when_the_flag_is_unset",
    "--max-staleness": "test_cli.py::test_config_prints_the_workflow_input_that_temporal_decodes_as_the_run_s_numbers",
    "--staleness-control": "test_staleness.py::test_staleness_control_picks_whether_the_runs_async_pool_paces_new_groups",
    "--fully-async": "test_fully_async.py::test_a_long_tail_group_never_delays_a_step",
    "--max-concurrent-rollouts": "test_fully_async.py::test_a_long_tail_group_never_delays_a_step",
    "--n-samples-per-eval-prompt": "test_rollout_data.py::test_each_eval_prompt_is_sampled_n_samples_per_eval_prompt_times",
    "--custom-rm-path": "test_bad_input.py::test_a_reward_function_that_raises_on_every_sample_stops_the_run_in_one_line_and_the_fixed_run_resumes",
    "--custom-rm-timeout": "test_hook_failures.py::test_a_reward_that_hangs_times_out_on_its_own_sample_and_names_the_hook",
    "--group-rm": "test_rollout_generate.py::test_group_rm_sees_the_whole_group_once",
    "--rm-type": "test_fully_async_rollout.py::test_each_call_returns_the_next_groups_to_finish_while_others_keep_generating",
    "--rm-url": "test_opd.py::test_the_teacher_is_the_topology_model_named_teacher_else_the_rm_url",
    "--reward-key": "test_advantages.py::test_adapter_reads_samples_reward_key_and_infra_flag",
    "--lr": "test_sft.py::test_sft_teaches_the_tool_call_answers_and_the_saved_model_reproduces_each_one",
    "--weight-decay": "test_trainer.py::test_the_optimizer_is_adamw_with_the_betas_and_weight_decay_of_the_flags",
    "--adam-beta1": "test_trainer.py::test_the_optimizer_is_adamw_with_the_betas_and_weight_decay_of_the_flags",
    "--adam-beta2": "test_trainer.py::test_the_optimizer_is_adamw_with_the_betas_and_weight_decay_of_the_flags",
    "--lora-rank": "test_lora.py::test_target_modules_alpha_and_dropout_reach_the_adapter",
    "--lora-alpha": "test_lora.py::test_target_modules_alpha_and_dropout_reach_the_adapter",
    "--lora-dropout": "test_lora.py::test_target_modules_alpha_and_dropout_reach_the_adapter",
    "--target-modules": "test_lora.py::test_target_modules_alpha_and_dropout_reach_the_adapter",
    "--lora-save-merged": "test_lora.py::test_lora_save_merged_writes_hf_weights_that_plain_transformers_loads",
    "--gradient-checkpointing": "test_trainer.py::test_gradient_checkpointing_keeps_fewer_activations_for_backward_and_gives_the_same_update",
    "--clip-grad": "test_trainer.py::test_a_gradient_whose_norm_exceeds_clip_grad_is_scaled_to_it_and_clip_grad_0_does_not_clip",
    "--global-batch-size": "test_batching.py::test_steps_accept_rollout_lists_and_reject_a_zero_batch_size",
    "--max-tokens-per-gpu": "test_trainer.py::test_on_cpu_a_step_packs_rows_of_1024_tokens_by_default_and_the_budget_does_not_change_the_update",
    "--seed": "test_benchmarks.py::test_the_weight_sync_benchmark_compares_the_engines_on_the_tiny_model",
    "--sft-num-steps": "test_sft.py::test_sft_teaches_the_tool_call_answers_and_the_saved_model_reproduces_each_one",
    "--save": "test_chaos.py::test_a_run_survives_sigterm_and_each_of_its_parts_dying_and_trains_every_sample_on_policy",
    "--save-interval": "test_chaos.py::test_a_run_survives_sigterm_and_each_of_its_parts_dying_and_trains_every_sample_on_policy",
    "--load": "test_preflight.py::test_load_may_be_missing_but_not_a_file",
    "--ref-load": "test_preflight.py::test_a_reference_model_is_checked_like_the_policy_when_a_kl_term_loads_it",
    "--run-id": "test_cli.py::test_config_prints_the_workflow_input_that_temporal_decodes_as_the_run_s_numbers",
    "--run-dir": "test_bad_input.py::test_a_launch_on_a_live_runs_directory_is_refused_in_one_line_and_writes_nothing",
    "--temporal-address": "test_cli.py::test_an_unreachable_temporal_address_is_one_line",
    "--fleet": "test_fleet.py::test_two_lora_runs_start_on_a_warm_fleet_and_sigterm_stops_every_part",
    "--temporal-namespace": "test_temporal_flags.py::test_temporal_namespace_is_where_the_run_s_dev_server_and_workers_keep_its_workflows",
    "--heartbeat-timeout": "test_temporal_flags.py::test_heartbeat_timeout_is_the_heartbeat_timeout_of_the_trainer_activities_the_run_schedules",
    "--rollout-task-queue": "test_tool_use.py::test_a_rollout_worker_starting_removes_the_sandboxes_a_worker_killed_with_sigkill_left",
    "--trainer-task-queue": "test_cli.py::test_config_prints_the_workflow_input_that_temporal_decodes_as_the_run_s_numbers",
    "--max-runs-per-trainer": "test_tenants.py::test_leases_let_lora_runs_of_one_base_in_together_up_to_the_bound_and_keep_others_waiting",
    "--weight-sync-engine": "test_weight_sync_run.py::test_a_run_syncs_two_servers_by_broadcast_and_sends_deltas_after_the_first",
    "--update-weight-mode": "test_weight_sync_run.py::test_a_run_syncs_two_servers_by_broadcast_and_sends_deltas_after_the_first",
    "--update-weight-buffer-size": "test_weight_sync_buckets.py::test_update_weight_buffer_size_is_the_bucket_the_collective_sync_broadcasts_in",
    "--vllm-model-urls": "test_on_policy_distillation.py::test_the_students_reverse_kl_to_the_teacher_on_held_out_prompts_falls",
    "--store-url": "test_long_lived_workers.py::test_a_worker_reads_a_recorded_run_s_flags_and_keeps_its_own_connections",
    "--continue-as-new-after-steps": "test_long_runs.py::test_a_run_continues_as_new_three_times_with_a_prefetched_step_in_flight",
    "--rollout-env": "test_coding_agent_rl_gain.py::test_rl_gain_flags_parse_over_the_example_defaults_and_evaluate_in_the_run",
    "--rollout-workflow": "test_environments.py::test_the_older_rollout_workflow_flag_still_names_the_coding_agent",
    "--sandbox-backend": "test_coding_agent_rl_gain.py::test_rl_gain_flags_parse_over_the_example_defaults_and_evaluate_in_the_run",
    "--sandbox-workspace-mb": "test_sandbox_limits.py::test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults",
    "--sandbox-tmp-mb": "test_sandbox_limits.py::test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults",
    "--sandbox-shm-mb": "test_sandbox_limits.py::test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults",
    "--sandbox-cpu-seconds": "test_sandbox_limits.py::test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults",
    "--sandbox-max-concurrent": "test_sandbox_limits.py::test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults",
    "--vllm-config": "test_engine_fleet.py::test_a_frozen_models_server_comes_back_on_its_checkpoint_not_the_policys_live_weights",
    "--vllm-router-ip": "test_bad_input.py::test_a_bad_prompt_file_is_one_line_naming_file_line_and_key_before_anything_starts",
    "--vllm-router-port": "test_bad_input.py::test_a_bad_prompt_file_is_one_line_naming_file_line_and_key_before_anything_starts",
    "--vllm-num-servers": "test_vllm_config.py::test_without_a_config_the_topology_is_the_policy_on_n_servers",
    "--engine-progress-timeout": "test_chaos.py::test_a_run_survives_sigterm_and_each_of_its_parts_dying_and_trains_every_sample_on_policy",
    "--sandbox-task-queue": "test_sandbox_lifecycle.py::"
                            "test_boot_sandbox_run_twice_with_one_key_leaves_one_workdir_and_no_bwrap_of_the_first",
    "--vllm-server-urls": "test_deploy.py::test_the_workers_reach_the_servers_the_file_starts",
    "--engine-host": "test_engine.py::test_vime_engine_serves_on_the_engine_host_and_port_of_its_flags",
    "--engine-port": "test_deploy.py::test_the_workers_reach_the_servers_the_file_starts",
    "--router-policy": "test_seed_surface.py::test_router_policy_is_a_router_flag_with_cache_aware_by_default",
    "--min-lr": "test_flag_effects.py::test_the_lr_schedule_flags_shape_the_schedule",
    "--lr-decay-style": "test_flag_effects.py::test_the_lr_schedule_flags_shape_the_schedule",
    "--lr-warmup-iters": "test_flag_effects.py::test_the_lr_schedule_flags_shape_the_schedule",
    "--use-dynamic-batch-size": "test_flag_effects.py::test_use_dynamic_batch_size_needs_a_token_budget_and_admits_micro_batch_size",
    "--eval-input-key": "test_eval.py::test_eval_sets_are_read_with_the_eval_keys",
    "--eval-label-key": "test_eval.py::test_eval_sets_are_read_with_the_eval_keys",
    "--eval-tool-key": "test_eval.py::test_eval_sets_are_read_with_the_eval_keys",
    "--eval-temperature": "test_eval.py::test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling",
    "--eval-top-p": "test_eval.py::test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling",
    "--eval-top-k": "test_eval.py::test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling",
    "--eval-max-response-len": "test_eval.py::test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling",
    "--eval-interval": "test_eval_run.py::test_a_run_evaluates_at_0_every_n_steps_and_after_the_last_on_one_policy_version_each",
    "--eval-function-path": "test_eval_run.py::test_fully_async_trains_while_a_round_evaluates_each_round_on_exactly_one_policy_version",
    "--skip-eval-before-train": "test_eval.py::test_eval_flags_parse_as_slime_names_them_and_shape_eval_sampling",
    "--use-wandb": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-project": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-group": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-team": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-dir": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-key": "test_metrics_wandb.py::test_a_run_logs_each_line_to_one_wandb_run_offline_and_a_relaunch_continues_it_once",
    "--wandb-run-id": "test_metrics_wandb.py::test_wandb_run_id_names_the_run_and_the_run_s_settings_are_its_own",
    "--wandb-mode": "test_metrics_wandb.py::test_wandb_run_id_names_the_run_and_the_run_s_settings_are_its_own",
    "--wandb-host": "test_metrics_wandb.py::test_wandb_run_id_names_the_run_and_the_run_s_settings_are_its_own",
    "--metrics-port": "test_metrics_prometheus.py::test_a_long_lived_rollout_worker_serves_each_runs_steps_samples_failures_sync_times_and_queue_backlogs",
}

# flag -> (a command line parse_args refuses, a fragment of the one-line reason)
REFUSED = {
    "--eval-config-data": (["--eval-config-data", "{}"],  # vime's record of --eval-config in a run's flags
                           "--eval-config-data is vime's record of an --eval-config file's content"),
    "--micro-batch-size": (["--micro-batch-size", "4"],
                           "--micro-batch-size 4: vime packs each micro-batch up to --max-tokens-per-gpu tokens"),
    "--opd-type": (["--use-opd", "--opd-type", "megatron"],  # vllm and sglang both name the one teacher vime has
                   "--opd-type megatron: vime has no teacher inside the trainer; its teacher is a server"),
}

def _dest(option: str) -> str:
    return option.removeprefix("--").replace("-", "_")


def _math_flags() -> set[str]:
    return {t for _, base, flipped, _ in MATH_FLAGS for t in [*base, *flipped] if t.startswith("--")}


def test_every_declared_flag_is_accounted_for():
    declared = {_option(f) for f in flag_fields()}
    tables = {"test_flag_math.FLAGS": _math_flags() & declared, "EXERCISED": set(EXERCISED),
              "REFUSED": set(REFUSED)}
    missing = declared - set().union(*tables.values())
    assert not missing, (f"{sorted(missing)}: declared but neither exercised nor refused; add the test that shows "
                         "the effect to EXERCISED, or refuse the flag with its reason (REFUSED)")
    stale = set().union(*tables.values()) - declared
    assert not stale, f"{sorted(stale)} are not declared flags any more; remove them here"
    names = list(tables)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if a != "test_flag_math.FLAGS" and b != "test_flag_math.FLAGS":
                assert not tables[a] & tables[b], f"{sorted(tables[a] & tables[b])} are in both {a} and {b}"


def _test_source(file: str, name: str) -> str | None:
    path = ROOT / "tests" / file
    if not path.exists():
        return None
    source = path.read_text()
    for node in ast.parse(source).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return ast.get_source_segment(source, node)
    return None


@pytest.mark.parametrize("option", sorted(EXERCISED))
def test_the_test_named_for_a_flag_exists_and_uses_the_flag(option):
    file, _, name = EXERCISED[option].partition("::")
    source = _test_source(file, name)
    assert source is not None, f"{option}: tests/{file} has no test {name}"
    assert option in source or _dest(option) in source, f"{option}: tests/{file}::{name} does not use the flag"


@pytest.mark.parametrize("option", sorted(REFUSED))
def test_a_refused_flag_is_refused_with_its_reason(option):
    argv, reason = REFUSED[option]
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert reason in str(info.value)


def test_the_lr_schedule_flags_shape_the_schedule():
    def schedule(*argv: str) -> list[float]:
        f = lr_lambda(parse_args(["--lr", "1e-5", *argv]), total_steps=10)
        return [f(step) for step in range(10)]

    assert schedule() == [1.0] * 10
    linear = schedule("--lr-decay-style", "linear")
    assert linear[0] == 1.0 and linear[-1] < 0.2 and linear == sorted(linear, reverse=True)
    cosine = schedule("--lr-decay-style", "cosine")
    assert cosine != linear and cosine[-1] < 0.1
    assert schedule("--lr-decay-style", "linear", "--min-lr", "5e-6")[-1] >= 0.5  # the floor: min_lr / lr
    assert schedule("--lr-warmup-iters", "4")[:4] == [0.25, 0.5, 0.75, 1.0]


def test_use_dynamic_batch_size_needs_a_token_budget_and_admits_micro_batch_size():
    with pytest.raises(ConfigError, match="--use-dynamic-batch-size needs --max-tokens-per-gpu"):
        parse_args(["--use-dynamic-batch-size"])
    args = parse_args(["--use-dynamic-batch-size", "--max-tokens-per-gpu", "2048", "--micro-batch-size", "4"])
    assert (args.max_tokens_per_gpu, args.micro_batch_size) == (2048, 4)  # ignored, as slime ignores it here
    assert parse_args(["--micro-batch-size", "1"]).micro_batch_size == 1  # slime's default: what vime does anyway
