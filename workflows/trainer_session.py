"""The training workflow's trainer session: pick a live trainer, attach it to the run's lineage,
train, sync and checkpoint on it, and release it at the run's end.

A trainer is a process group with the model on its own task queue (`activities/train.py`), leased
to one run at a time. The session survives losing it:

- a timeout, `WorkerLost` (the launcher saw the worker die, `vime.launcher.recovery`) or a `trainer_lost`
  signal abandons the pending call; the next live trainer is picked and attached: it loads the
  last checkpoint, replays the steps trained since from their manifests (each sample trained once
  more in the same step, on the same lineage) and pushes this policy to the servers again under
  its own version;
- an error the trainer raised is retried on a re-attached trainer a few times
  (`MAX_TRAINER_ERRORS`), then fails the run with the trainer's message; a `ConfigError` fails
  it at once.

Runs inside the TrainingWorkflow: deterministic, light imports only. The activity calls and their
order are the workflow's history: recorded histories replay against them (tests/test_replay.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import CONFIG_ERROR, WORKER_LOST, final_error, root_message
    from vime.temporal.training_contract import TrainingConfig, TrainingState
    from workflows.trainer_calls import (ATTACH_TRAINER, PICK_TRAINER, RELEASE_TRAINER, SAVE_CHECKPOINT, SYNC_WEIGHTS,
                                         TRAIN_STEP, AttachInput, PickInput, SaveInput, SyncInput, TrainerInfo,
                                         TrainInput)

RELEASE_TRAINER_PATCH = "release-trainer"  # workflows recorded before trainers were leased
MAX_TRAINER_ERRORS = 3
T = TypeVar("T")


async def _attached(info: TrainerInfo) -> TrainerInfo:
    return info


class TrainerSession:
    """The run's trainer, as the step loop sees it. `cfg` and `state` are the workflow's own
    (the session advances `state.weight_version` and the checkpoint fields); `set_phase` shows
    what the run waits on in the `progress` query."""

    def __init__(self, set_phase: Callable[[str], None]) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.set_phase = set_phase
        self.trainer: TrainerInfo | None = None  # attached and in sync; None: attach before the next call
        self.leased: str | None = None  # the queue of the trainer this run picked last (released at its end)
        self.losses = 0  # `trainer_lost` signals received

    def begin(self, cfg: TrainingConfig, state: TrainingState) -> None:
        self.cfg, self.state = cfg, state

    @property
    def attached(self) -> bool:
        """A trainer is attached (False after a loss, until the next call re-attaches one)."""
        return self.trainer is not None

    def lost(self) -> None:
        """The launcher saw the trainer's process die (the `trainer_lost` signal)."""
        self.losses += 1
        self.trainer = self.leased = None  # a dead trainer holds no lease worth releasing

    # ---- the step loop's calls ---------------------------------------------------------------

    async def attach(self) -> TrainerInfo:
        """A trainer attached to the run and the servers on its policy (a no-op when it is)."""
        return await self.with_trainer("attach", _attached)

    async def train(self, step: int) -> dict:
        return await self.with_trainer("train", lambda info: self._train_on(info, step))

    async def sync(self) -> dict:
        """The step's sync, under a version fixed before the first try: a retry (a trainer-lost
        signal that lands after a sync went through, as on a rerun after Ctrl-C) pushes the same
        version again instead of bumping it twice for one step. Steps whose sync was held
        (`hold`) go out with it: the version counts every step trained."""
        version = self.state.trainer_version + 1
        report = await self.with_trainer("sync", lambda info: self._sync_on(info, version))
        self.state.held_syncs = 0
        return report

    def hold(self) -> None:
        """The step trained, but its weights stay off the servers (an eval round samples the
        version they hold, `workflows.eval_beside`): the trainer's version moves on alone."""
        self.state.held_syncs += 1

    async def push_held(self) -> dict:
        """Push the weights of the steps trained while syncs were held, as the trainer's version."""
        if not self.state.held_syncs:
            return {}
        version = self.state.trainer_version
        report = await self.with_trainer("sync", lambda info: self._sync_on(info, version))
        self.state.held_syncs = 0
        return report

    async def checkpoint(self) -> None:
        cfg, state = self.cfg, self.state

        async def save(info: TrainerInfo) -> str:
            return await workflow.execute_activity(
                SAVE_CHECKPOINT,
                SaveInput(cfg.run_id, cfg.save, state.step, state.weight_version, state.data_position),
                result_type=str, task_queue=info.queue, schedule_to_start_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=cfg.trainer_heartbeat_seconds),
                start_to_close_timeout=timedelta(seconds=3600), retry_policy=RetryPolicy(maximum_attempts=1))

        path = await self.with_trainer("checkpoint", save)
        state.checkpoint, state.checkpoint_step = path, state.step

    async def release(self) -> None:
        """Free the trainer this run picked last for the next run at once (else its lease runs out;
        also when its attach failed). A trainer the run lost is not asked (it is gone, and asking
        a dead queue would hold the run's end up until the schedule-to-start timeout)."""
        queue, self.leased = self.leased, None
        if queue is None or not workflow.patched(RELEASE_TRAINER_PATCH):
            return
        try:
            await workflow.execute_activity(RELEASE_TRAINER, self.cfg.run_id, task_queue=queue,
                                            schedule_to_start_timeout=timedelta(seconds=30),
                                            start_to_close_timeout=timedelta(seconds=30),
                                            retry_policy=RetryPolicy(maximum_attempts=1))
        except ActivityError as e:
            workflow.logger.warning("release_trainer %s: %s", queue, e.cause)

    # ---- losing and re-attaching -------------------------------------------------------------

    async def with_trainer(self, phase: str, call: Callable[[TrainerInfo], Awaitable[T]]) -> T:
        """Run `call(trainer)`; on a lost trainer (a timeout, `WorkerLost` from the launcher that
        saw it die, or a `trainer_lost` signal) re-attach and retry.

        An error the trainer raised is retried on a re-attached trainer a few times, then fails
        the run with the trainer's message: a bug or bad data does not fix itself by looping.
        """
        errors = 0
        while True:
            seen = self.losses
            attempt = asyncio.create_task(self._attempt(phase, call))
            await workflow.wait_condition(lambda: attempt.done() or self.losses != seen)
            if not attempt.done():
                attempt.cancel()
                try:
                    await attempt
                except (asyncio.CancelledError, ActivityError):
                    pass
                workflow.logger.warning("%s: the trainer is gone (signalled); re-attaching", phase)
                continue
            try:
                return attempt.result()
            except ActivityError as e:
                if isinstance(e.cause, ApplicationError) and e.cause.type == CONFIG_ERROR:
                    raise final_error(f"{phase}: {root_message(e)}") from e
                self.trainer = None
                lost = isinstance(e.cause, TimeoutError) or (
                    isinstance(e.cause, ApplicationError) and e.cause.type == WORKER_LOST)
                if lost:  # dead, or leased to another run since: nothing of this run's to release
                    self.leased = None
                else:
                    errors += 1
                    if errors >= MAX_TRAINER_ERRORS:
                        raise ApplicationError(f"{phase} failed {errors} times: {root_message(e)}",
                                               non_retryable=True) from e
                workflow.logger.warning("%s: trainer lost or failed (%s); re-attaching", phase, e.cause)

    async def _attempt(self, phase: str, call: Callable[[TrainerInfo], Awaitable[T]]) -> T:
        info = self.trainer or await self._attach()
        self.set_phase(phase)
        return await call(info)

    async def _attach(self) -> TrainerInfo:
        """Pick a live trainer and bring it to `state.checkpoint_step`, then replay to `state.step`
        (unless it holds the run at `state.step` already)."""
        cfg, state = self.cfg, self.state
        self.set_phase("attach")
        info = await workflow.execute_activity(
            PICK_TRAINER, PickInput(cfg.run_id), result_type=TrainerInfo, task_queue=cfg.trainer_task_queue,
            schedule_to_close_timeout=timedelta(hours=1),  # waiting out a busy trainer, checked every 10 s at most
            start_to_close_timeout=timedelta(seconds=30),  # an answer is instant: a lost attempt is tried again
            retry_policy=RetryPolicy(maximum_attempts=0, maximum_interval=timedelta(seconds=10)))
        self.leased = info.queue
        # A trainer that still holds the run at its last step (a continue-as-new, a re-attach after
        # a transient error) keeps it: no reload, no replay. Not while syncs are held: the servers
        # must get the weights of the synced step, which the trainer no longer has.
        current = None if state.held_syncs else state.step
        at = await workflow.execute_activity(
            ATTACH_TRAINER, AttachInput(cfg.run_id, state.checkpoint_step, state.checkpoint, current),
            result_type=int, task_queue=info.queue, schedule_to_start_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=cfg.trainer_heartbeat_seconds),
            start_to_close_timeout=timedelta(seconds=3600), retry_policy=RetryPolicy(maximum_attempts=1))
        self.trainer = info
        synced_step = state.step - state.held_syncs  # the step whose weights the servers hold
        for s in range(at, synced_step):  # steps trained since the checkpoint, from their manifests
            await self._train_on(info, s)
        # The servers may hold other weights (a lost trainer's, another run's): push this policy
        # again under its own version. A new version would age every group in flight by one
        # without the policy having changed (a kill -9 of the trainer trained a group 2 versions
        # old under --max-staleness 1). While syncs are held (an eval round samples), that is the
        # round's policy; the held steps are replayed after it, and their sync stays held.
        await self._sync_on(info, state.weight_version)
        for s in range(synced_step, state.step):
            await self._train_on(info, s)
        return info

    async def _train_on(self, info: TrainerInfo, step: int) -> dict:
        return await workflow.execute_activity(
            TRAIN_STEP, TrainInput(self.cfg.run_id, step), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), start_to_close_timeout=timedelta(seconds=4 * 3600),
            heartbeat_timeout=timedelta(seconds=self.cfg.trainer_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=1))

    async def _sync_on(self, info: TrainerInfo, version: int) -> dict:
        """Push the trainer's weights to the servers as `version`."""
        report = await workflow.execute_activity(
            SYNC_WEIGHTS, SyncInput(version, run_id=self.cfg.run_id), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), start_to_close_timeout=timedelta(seconds=3600),
            heartbeat_timeout=timedelta(seconds=self.cfg.trainer_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=1))
        self.state.weight_version = version
        return report
