"""The training workflow's contract with whoever starts, follows or signals it (`vime train`,
`vime config`, `vime status`, the workers' hook notices): its registered name, its input, state
and config, its query and signals, by name.

The launcher starts `TrainingWorkflow` by this name and these dataclasses instead of importing
the workflow class, so vime/ never imports workflows/ (the workflow, in workflows/training.py,
registers itself under the same names). Standard library + temporalio only: workflows import
it inside the sandbox.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from vime.temporal.error_types import WORKER_LOST, failure_message, root_message  # noqa: F401 - the contract's
from vime.temporal.group_contract import GroupOutput as RolloutOutput

TRAINING_WORKFLOW = "TrainingWorkflow"  # the registered workflow type (`temporal workflow start --type`)
PROGRESS_QUERY = "progress"  # -> dict: step, num_rollout, phase, weight_version, metrics, notices, ...
NOTICE_SIGNAL = "notice"  # (line: str): a line for the console from a worker (`activities.hook_notices`)
TRAINER_LOST_SIGNAL = "trainer_lost"  # (): the launcher saw the trainer die: re-attach one now


@dataclass
class TrainingConfig:
    run_id: str
    num_rollout: int
    rollout_batch_size: int
    over_sampling_batch_size: int
    trainer_task_queue: str = "vime-trainer"
    max_staleness: int = 0
    save: str | None = None
    save_interval: int | None = None
    trainer_heartbeat_seconds: float = 60.0
    rollout_heartbeat_seconds: float = 60.0
    max_filter_rounds: int = 16
    custom_rollout_function: bool = False  # --rollout-function-path replaces per-group workflows
    rollout_task_queue: str = "vime-rollout"
    rollout_workflow: str = "RolloutWorkflow"  # the environment's group workflow, by registered name (vime.envs)
    n_samples_per_prompt: int = 1
    sandbox_task_queue: str = "vime-sandbox"
    continue_as_new_after_steps: int = 0  # 0: when Temporal suggests it
    fully_async: bool = False  # a pool of groups always in flight, steps in finish order (async_pool)
    max_concurrent_rollouts: int = 0  # groups in flight in fully async mode (0: rollout_batch_size)
    staleness_control: str = "pace"  # or "discard" (fully async mode)
    local_activities: bool = True  # each group generated as a local activity of its workflow (cheaper)
    max_failed_sample_ratio: float = 0.1  # a step's share of samples a hook may fail (workflows.failures)
    run_argv: list[str] = field(default_factory=list)  # the run's flags: workers read its config (run_args)
    eval_interval: int = 0  # eval rounds at step 0, every N steps and after the last (0: none; workflows.eval_round)
    skip_eval_before_train: bool = False  # no round at step 0
    eval_by_function: bool = False  # --eval-function-path (or a custom rollout function) evaluates a round
    n_samples_per_eval_prompt: int = 1


NO_FLAG = ("max_filter_rounds", "local_activities")
"""`TrainingConfig` fields that no flag sets: their defaults hold (tests and benches set them)."""


def training_config_from(flags: Mapping[str, Any], **derived: Any) -> TrainingConfig:
    """The workflow's config from the parsed flags (`vars(args)`): every field named like a flag
    takes that flag's value, `derived` gives the rest (fields computed from flags), `NO_FLAG`
    keep their defaults. A field that is none of these (a flag renamed) is a `KeyError` at the
    first `vime config` or launch, not a silent default."""
    names = [f.name for f in fields(TrainingConfig) if f.name not in derived and f.name not in NO_FLAG]
    return TrainingConfig(**{name: flags[name] for name in names}, **derived)


@dataclass
class PooledGroup:
    """A finished group waiting for a step (fully async, `workflows.async_pool`); small, so
    continue-as-new hands the queue over in `TrainingState.queued`."""

    position: int
    weight_version: int  # the policy version the group started under
    out: RolloutOutput = field(default_factory=lambda: RolloutOutput(0))


@dataclass
class TrainingState:
    step: int = 0  # next rollout step to train
    data_position: int = 0  # next prompt position to hand out
    weight_version: int = 0
    checkpoint_step: int = 0
    checkpoint: str | None = None
    metrics: list[dict] = field(default_factory=list)  # the most recent steps' metrics
    queued: list[PooledGroup] = field(default_factory=list)  # fully async: finished groups handed over
    held_syncs: int = 0  # fully async: steps trained while an eval round samples, their sync held (eval_beside)

    @property
    def trainer_version(self) -> int:
        """The policy version the trainer holds: the servers' (`weight_version`) plus the steps
        trained since whose sync is held. Staleness is counted against it."""
        return self.weight_version + self.held_syncs


@dataclass
class TrainingInput:
    config: TrainingConfig
    state: TrainingState = field(default_factory=TrainingState)
