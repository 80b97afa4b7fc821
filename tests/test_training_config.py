"""The training workflow's config is derived from the parsed flags, not copied field by field:
each `TrainingConfig` field is a flag of its name, one the launcher computes, or one no flag sets."""

from __future__ import annotations

import dataclasses

from vime.config.args import VimeArgs, parse_args
from vime.config.run_input import training_config
from vime.temporal.training_contract import NO_FLAG, TrainingConfig

DERIVED = {"over_sampling_batch_size", "save", "trainer_heartbeat_seconds", "rollout_heartbeat_seconds",
           "custom_rollout_function", "rollout_workflow", "max_concurrent_rollouts", "run_argv", "eval_by_function"}


def test_every_field_is_a_flag_of_its_name_derived_or_set_by_no_flag():
    flags = {f.name for f in dataclasses.fields(VimeArgs)}
    config = {f.name for f in dataclasses.fields(TrainingConfig)}
    assert config - flags - set(NO_FLAG) <= DERIVED  # a renamed flag fails here (and in training_config_from)


def test_the_flags_values_reach_the_config(tmp_path):
    args = parse_args(["--run-id", "r1", "--num-rollout", "7", "--rollout-batch-size", "3", "--n-samples-per-prompt",
                       "5", "--max-staleness", "2", "--save", str(tmp_path / "ckpt"), "--save-interval", "4", "--heartbeat-timeout", "9",
                       "--rollout-task-queue", "q-r", "--trainer-task-queue", "q-t", "--max-failed-sample-ratio",
                       "0.5", "--store-url", f"sqlite:///{tmp_path}/v.db"])
    cfg = training_config(args)
    assert (cfg.run_id, cfg.num_rollout, cfg.rollout_batch_size, cfg.n_samples_per_prompt, cfg.max_staleness,
            cfg.save_interval) == ("r1", 7, 3, 5, 2, 4)
    assert (cfg.over_sampling_batch_size, cfg.trainer_heartbeat_seconds, cfg.rollout_heartbeat_seconds) == (3, 9, 9)
    assert (cfg.rollout_task_queue, cfg.trainer_task_queue, cfg.max_failed_sample_ratio) == ("q-r", "q-t", 0.5)
    assert (cfg.max_filter_rounds, cfg.local_activities) == (16, True)  # no flag: the defaults
    assert cfg.run_argv == list(args.argv) and cfg.save == str((tmp_path / "ckpt").resolve())
