"""Where a training workflow starts: what the store durably recorded wins over the input's state.

The input's state (`TrainingInput.state`) says where a run starts: `vime train` and `vime config`
build it from the newest checkpoint under --load, so it is right when they write it. But the same
JSON can be started again later: the Web UI's Start Workflow form, `temporal workflow start`
twice, a file kept from the run's first day. Temporal's default id-reuse policy lets a completed
`train-<run>` start again, and such a start would re-attach the trainer and train the run's
recorded steps once more. So before it attaches a trainer, the workflow reads what the store holds
of the run (`run_record`: the steps whose samples were trained, the newest checkpoint saved, and
whether the run finished) and applies this rule:

- **Finished** (the run's workflow recorded its end, `record_finished`): nothing is trained and
  no trainer attached. The workflow completes at once, returning the finished state, with one
  line in its memo, its details and the `progress` query's notices (`finished_line`). A finished
  run trains more only as a new run (`--run-id`, `--load` its checkpoints).
- **Behind** (the store records `T` trained steps, the input starts before step `T - 1`): the run
  resumes at step `max(T - 1, c)`, `c` being the newest checkpoint the store recorded for the run.
  The trainer attaches at that checkpoint (else the input's, else the base weights) and replays
  the steps between from their manifests, as after a lost trainer: the model is at every step what
  it was, and no step is trained twice on one lineage. Step `T - 1` is trained again in the loop
  unless a checkpoint after it exists, because the store cannot tell whether its weight sync,
  metrics line and checkpoint happened (the line and the checkpoint are written once per step).
  Policy versions follow the steps (each trained step's sync adds one), so the version at the
  resume step is the base's plus the steps since.
- Otherwise (a new run, `vime train`'s own resume, a continue-as-new) the input stands.

Pure and deterministic: the workflow calls it with the `run_record` activity's result.
"""

from __future__ import annotations

from dataclasses import dataclass

from vime.temporal.training_contract import TrainingConfig, TrainingState
from workflows.steps import RunRecord

FINISHED_FIELDS = ("step", "data_position", "weight_version", "checkpoint_step", "checkpoint")
"""The `TrainingState` fields a finished run's record keeps (not its recent metrics)."""


@dataclass
class Resume:
    """Where the durable record moves a start that was behind it, and the line that says so."""

    step: int
    weight_version: int
    data_position: int
    checkpoint_step: int
    checkpoint: str | None
    line: str


def finished_record(state: TrainingState) -> dict:
    return {name: getattr(state, name) for name in FINISHED_FIELDS}


def finished_state(record: RunRecord) -> TrainingState | None:
    """The state the run finished with, None when the store has not recorded its end."""
    if record.finished is None:
        return None
    return TrainingState(**{name: record.finished[name] for name in FINISHED_FIELDS if name in record.finished})


def finished_line(cfg: TrainingConfig, state: TrainingState) -> str:
    steps = f"{state.step} step" + ("" if state.step == 1 else "s")
    return (f"run {cfg.run_id} already finished {steps}; nothing trained. Start a new --run-id "
            f"(with --load {cfg.save or 'CHECKPOINT_DIR'} to start from its weights) to train more")


def resume_point(cfg: TrainingConfig, state: TrainingState, record: RunRecord) -> Resume | None:
    """Where a run that is not finished resumes when its input is behind the store (see the
    module's rule); None when the input's state stands."""
    trained = record.trained_steps
    if trained <= state.step + 1:  # at most the last trained step is redone, as a resume always did
        return None
    ckpt = record.checkpoint
    adopt = ckpt is not None and state.checkpoint_step < ckpt["step"] <= trained
    base_step, base_version = (ckpt["step"], ckpt["weight_version"]) if adopt else (state.step, state.weight_version)
    step = max(trained - 1, base_step)
    where = f" and a checkpoint at step {ckpt['step']}" if adopt else ""
    line = (f"run {cfg.run_id}: the store records {trained} trained steps{where}, but this start's input says step "
            f"{state.step}; resuming at step {step} so that no recorded step is trained twice")
    return Resume(step, base_version + step - base_step, max(state.data_position, record.next_position),
                  ckpt["step"] if adopt else state.checkpoint_step, ckpt["path"] if adopt else state.checkpoint, line)
