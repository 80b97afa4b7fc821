"""The eval workflow's contract with `vime eval` (which starts and follows it) and its workers:
its registered name, input, the weight-load activity's name and input.

`vime eval` evaluates checkpoints as a run of their own: one `EvalWorkflow` (id `eval-<run>`)
that, for each checkpoint in turn, loads its weights into the rollout servers and runs the same
eval round the training workflow runs (`workflows.eval_round`). The launcher starts it by this
name and these dataclasses, so vime/ never imports workflows/. Standard library + temporalio
only: workflows import it inside the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vime.temporal.training_contract import TrainingConfig

EVAL_WORKFLOW = "EvalWorkflow"  # the registered workflow type
LOAD_CHECKPOINT = "load_checkpoint"  # activity: push a checkpoint's weights into the rollout servers
SERVERS_LOST_SIGNAL = "trainer_lost"  # (): a new launch (fresh servers): reload the weights before sampling


def eval_workflow_id(run_id: str) -> str:
    return f"eval-{run_id}"


@dataclass
class EvalCheckpoint:
    """One checkpoint to evaluate: the round's `step` (its training step; 0 for an HF
    checkpoint), the directory whose `model.safetensors` is loaded into the servers before the
    round (None: the servers boot on it, nothing to load), and the policy version the servers
    report for it (each eval sample is checked to carry exactly it)."""

    step: int
    label: str
    path: str | None = None
    weight_version: int = 0


@dataclass
class EvalRunInput:
    config: TrainingConfig
    checkpoints: list[EvalCheckpoint] = field(default_factory=list)


@dataclass
class LoadCheckpointInput:
    run_id: str
    path: str
    weight_version: int
