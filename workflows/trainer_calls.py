"""The trainer activities' names, error types and payloads (see activities/train.py): light, for workflows."""

from __future__ import annotations

from dataclasses import dataclass, field

from vime.temporal.error_types import WORKER_LOST  # noqa: F401 - activities/train.py raises it by this name

TRAINER_BUSY = "TrainerBusy"  # pick_trainer: leased to another run (retried until it is free)
SUPERSEDED = "Superseded"  # a call its workflow gave up on, refused once a newer call of the run came

# The trainer activities (activities/train.py registers them under these names).
PICK_TRAINER = "pick_trainer"
ATTACH_TRAINER = "attach_trainer"
TRAIN_STEP = "train_step"
SYNC_WEIGHTS = "sync_weights"
SAVE_CHECKPOINT = "save_checkpoint"
RELEASE_TRAINER = "release_trainer"


@dataclass
class TrainerInfo:
    queue: str
    step: int
    identity: str = ""


@dataclass
class PickInput:
    run_id: str  # the run the picked trainer is leased to


@dataclass
class AttachInput:
    run_id: str
    step: int  # the step the trainer must be at after attaching
    checkpoint: str | None = None
    current: int | None = None  # the steps the run has trained: a trainer holding it there keeps it


@dataclass
class TrainInput:
    run_id: str
    step: int  # the trainer reads the step's manifest and samples from the store


@dataclass
class SyncInput:
    weight_version: int
    engine_urls: list[str] = field(default_factory=list)  # empty: the trainer's own --vllm-server-urls
    run_id: str = ""  # the run that syncs, for the trainer's log ("" in histories recorded before it)


@dataclass
class SaveInput:
    run_id: str
    root: str
    step: int
    weight_version: int
    data_position: int
