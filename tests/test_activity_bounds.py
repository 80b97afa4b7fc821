"""A rollout activity's lost start is found in seconds: its heartbeat timeout is at most 6 s,
whatever `--heartbeat-timeout` says; a user's whole-step hook keeps the flag's timeout whole."""

from __future__ import annotations

from datetime import timedelta

from vime.temporal.activity_bounds import ROLLOUT_HEARTBEAT_SECONDS, rollout_activity_options


def test_a_rollout_activity_heartbeats_within_six_seconds_whatever_the_flag():
    assert ROLLOUT_HEARTBEAT_SECONDS == 6
    assert rollout_activity_options(60)["heartbeat_timeout"] == timedelta(seconds=6)
    assert rollout_activity_options(5)["heartbeat_timeout"] == timedelta(seconds=5)  # a shorter flag wins


def test_a_users_whole_step_hook_keeps_the_flags_heartbeat_timeout():
    options = rollout_activity_options(60, timedelta(hours=12), capped=False)
    assert options["heartbeat_timeout"] == timedelta(seconds=60)
    assert options["start_to_close_timeout"] == timedelta(hours=12)


def test_a_rollout_activity_retries_infra_failures_without_limit_and_config_errors_never():
    policy = rollout_activity_options(60)["retry_policy"]
    assert policy.maximum_attempts == 0 and policy.non_retryable_error_types == ["ConfigError"]
