"""The step-manifest activities' names and payloads (see activities/steps.py): light, for workflows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

RECORD_STEP = "record_step"
RECORDED_STEPS = "recorded_steps"
REGISTER_RUN = "register_run"
RUN_RECORD = "run_record"
RECORD_FINISHED = "record_finished"


@dataclass
class RunRegistration:
    """A run's flags, recorded in the store when its training workflow starts (`vime.config.run_args`)."""

    run_id: str
    argv: list[str]
    evaluation: bool = False  # a `vime eval` run: its launcher checked its flags (it has no --prompt-data)


@dataclass
class StepRecord:
    run_id: str
    step: int
    rollout_ids: list[str]
    weight_version: int
    next_position: int  # the data position after the step's groups: where a resumed run goes on
    meta: dict[str, Any] = field(default_factory=dict)


@dataclass
class RecordedStepsInput:
    run_id: str
    from_step: int
    gap: int  # stop looking after this many consecutive steps without a manifest


@dataclass
class RecordedStep:
    step: int
    next_position: int
    rollouts: int
    weight_version: int
    failed_samples: int = 0  # samples a hook failed while the step was collected (its groups dropped)


@dataclass
class RunRecord:
    """What the store durably holds of a run when its training workflow starts (`run_record`);
    `workflows.durable_start` decides from it where the run resumes, or that it finished."""

    trained_steps: int = 0  # steps 0 .. trained_steps - 1 were trained (their samples marked)
    next_position: int = 0  # the data position after the last trained step's groups
    checkpoint: dict[str, Any] | None = None  # the newest checkpoint: step, path, weight_version, data_position
    finished: dict[str, Any] | None = None  # the state the run finished with (TrainingState's fields)


@dataclass
class FinishedRun:
    """A run's end, recorded in the store (`record_finished`): later starts of it train nothing."""

    run_id: str
    state: dict[str, Any]


RECORD_METRICS = "record_metrics"


@dataclass
class StepMetrics:
    """One finished step's metrics, for `<run_dir>/metrics.jsonl` (and TensorBoard when installed)."""

    run_id: str
    step: int
    metrics: dict[str, Any]
