"""TrainingWorkflow (`train-<run>`): finished rollouts in, update steps out.

Per rollout step: gather `rollout_batch_size` kept prompt groups from RolloutWorkflows, record
the step's manifest in the store (`record_step`: its rollout ids, written once), `train_step`
on the trainer's own task queue, `sync_weights` into the vLLM servers, and a checkpoint on
schedule. The workflow is a consumer of a stream of finished rollouts: the rollouts of step s
may start while the policy is at most `max_staleness` versions behind step s;
`max_staleness=0` is synchronous on-policy training.

What travels through Temporal stays small whatever the batch size: the trainer gets
`(run, step)` and reads the step's manifest and samples from the store; the state holds
counters, the checkpoint and recent metrics, never sample refs.

Crash model:
- a rollout worker dies → its activities are retried elsewhere (at once when the launcher saw
  the death, `vime.recovery`; else on heartbeat timeout); the store write is idempotent;
- an engine dies → the groups it was generating fail as infrastructure failures and their
  activities retry until it is back (nothing stored, no prompt skipped, no short step);
- the trainer dies → its activities time out (or fail with `WorkerLost`); the workflow picks
  another trainer, loads the last checkpoint into it, replays the steps trained since from
  their manifests (each sample trained once more in the same step, on the same lineage),
  re-syncs the servers and goes on;
- the workflow's own worker dies → Temporal replays the history on another one;
- the workflow fails (a configuration error) → `vime train` starts it again under the same id
  from the last checkpoint; steps already recorded are trained on their manifests, not sampled
  again (`recorded_steps`).

Continue-as-new (when Temporal suggests it, or every `continue_as_new_after_steps` steps): no
new rollouts start, the prefetched steps in flight finish and record their manifests, and the
next run finds them with `recorded_steps`: nothing is lost or collected twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import (ActivityError, ApplicationError, ChildWorkflowError, FailureError, TimeoutError,
                                  is_cancelled_exception)

with workflow.unsafe.imports_passed_through():
    from vime.temporal.search_attributes import POLICY_VERSION, ROLLOUT_STATUS, RUN_ID
    from workflows.async_pool import NothingToTrain, PoolConfig, PooledGroup, RolloutPool
    from workflows.failures import StepFailures
    from workflows.rollout import (CONFIG_ERROR, ROLLOUT_STEP, RolloutInput, RolloutOutput,
                                   RolloutStepInput, RolloutStepOutput, rollout_retry_policy,
                                   rollout_workflow_id, starting_search_attributes)
    from workflows.steps import (RECORD_METRICS, RECORD_STEP, RECORDED_STEPS, REGISTER_RUN, RecordedStep,
                                 RecordedStepsInput, RunRegistration, StepMetrics, StepRecord)
    from workflows.trainer_calls import (WORKER_LOST, AttachInput, PickInput, SaveInput, SyncInput, TrainerInfo,
                                         TrainInput)

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


@dataclass
class TrainingState:
    step: int = 0  # next rollout step to train
    data_position: int = 0  # next prompt position to hand out
    weight_version: int = 0
    checkpoint_step: int = 0
    checkpoint: str | None = None
    metrics: list[dict] = field(default_factory=list)  # the most recent steps' metrics
    queued: list[PooledGroup] = field(default_factory=list)  # fully async: finished groups handed over


@dataclass
class TrainingInput:
    config: TrainingConfig
    state: TrainingState = field(default_factory=TrainingState)


KEEP_METRICS = 100
METRICS_FILE_PATCH = "metrics-jsonl"  # workflows recorded before metrics.jsonl replay without it
REGISTER_RUN_PATCH = "register-run"  # workflows recorded before runs carried their flags
RELEASE_TRAINER_PATCH = "release-trainer"  # workflows recorded before trainers were leased
RESYNC_PATCH = "resync-while-collecting"  # workflows recorded before a lost trainer was re-attached at once
HOOK_FAILURES_PATCH = "hook-failures"  # workflows recorded before failed groups were counted and replaced
KEEP_NOTICES = 20
MAX_TRAINER_ERRORS = 3
T = TypeVar("T")


async def _attached(info: TrainerInfo) -> TrainerInfo:
    return info


def _short(seconds: float) -> dict:
    return dict(start_to_close_timeout=timedelta(seconds=seconds))


def _message(error: BaseException) -> str:
    """An error's own message (Temporal's `str()` prefixes an ApplicationError's type)."""
    return getattr(error, "message", None) or str(error)


def root_message(error: BaseException) -> str:
    """The innermost cause's message: what the user's hook or the engine said."""
    while error.__cause__ is not None or getattr(error, "cause", None) is not None:
        error = getattr(error, "cause", None) or error.__cause__
    return _message(error)


def failure_message(error: BaseException) -> str:
    """Why a workflow failed, in one line: its own error's message (which names the root cause),
    else the innermost cause's."""
    top = getattr(error, "cause", None)
    text = _message(top) if isinstance(top, ApplicationError) and _message(top) else root_message(error)
    return (text.splitlines() or [""])[0]


def _final(message: str) -> ApplicationError:
    return ApplicationError(message, type=CONFIG_ERROR, non_retryable=True)


@workflow.defn(name="TrainingWorkflow")
class TrainingWorkflow:
    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.trainer: TrainerInfo | None = None
        self.phase = "starting"
        self.recorded: dict[int, RecordedStep] = {}
        self.trainer_losses = 0  # `trainer_lost` signals received
        self.pool: RolloutPool | None = None  # fully async mode
        self.async_metrics: dict[int, dict] = {}  # fully async: staleness of each step taken
        self.next_take = 0  # fully async: the next step to take groups for
        self.children_running = 0  # rollout workflows started and not yet ended
        self.leased: str | None = None  # the queue of the trainer this run picked last (released at its end)
        self.notices: list[dict] = []  # the latest lines workers sent for the console (`notice`)

    @workflow.query
    def progress(self) -> dict:
        return {"step": self.state.step, "num_rollout": self.cfg.num_rollout if self.cfg else None,
                "phase": self.phase, "weight_version": self.state.weight_version,
                "data_position": self.state.data_position, "checkpoint_step": self.state.checkpoint_step,
                "checkpoint": self.state.checkpoint, "metrics": self.state.metrics[-KEEP_METRICS:],
                "notices": self.notices}

    @workflow.signal
    def notice(self, line: str) -> None:
        """A line for the console from a worker (a hook the run waits on: `activities.hook_notices`);
        `vime train` prints it from `progress`."""
        self.notices = (self.notices + [{"at": workflow.now().timestamp(), "line": line}])[-KEEP_NOTICES:]

    @workflow.signal
    def trainer_lost(self) -> None:
        """The launcher saw the trainer's process die, or started the run anew after its launcher
        died: whatever trainer call is pending is abandoned and a live trainer attached now,
        instead of after a heartbeat or schedule-to-start timeout."""
        self.trainer_losses += 1
        self.trainer = self.leased = None  # a dead trainer holds no lease worth releasing

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingState:
        """Train `num_rollout` steps. A cancel (`vime cancel`, the Web UI, `temporal workflow
        cancel`) cancels the rollouts in flight and waits for their cleanup (an agent rollout tears
        its sandbox down) before the run ends as cancelled."""
        self.prefetch: dict[int, asyncio.Task[RecordedStep]] = {}
        try:
            return await self._run(inp)
        except FailureError as e:  # the run fails (a cancel is handled below): free its trainer for others
            if not is_cancelled_exception(e):
                await self._release_trainer()
                raise
            await self._cancel_rollouts()
            raise
        except asyncio.CancelledError:
            await self._cancel_rollouts()
            raise

    async def _cancel_rollouts(self) -> None:
        """The run is being cancelled: cancel the rollouts in flight, wait for their cleanup, free
        the trainer."""
        self.phase = "cancelling"
        steps = list(self.prefetch.values())
        for task in steps:
            task.cancel()
        await asyncio.gather(*steps, return_exceptions=True)
        if self.pool:
            await self.pool.cancel()
        # A rollout closed with its parent is terminated, its cleanup cut: wait for each to end.
        await workflow.wait_condition(lambda: self.children_running == 0)
        await self._release_trainer()
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("cancelled")])

    async def _run(self, inp: TrainingInput) -> TrainingState:
        cfg, self.cfg, self.state = inp.config, inp.config, inp.state
        workflow.upsert_search_attributes([RUN_ID.value_set(cfg.run_id), ROLLOUT_STATUS.value_set("training")])
        if cfg.run_argv and workflow.patched(REGISTER_RUN_PATCH):  # before any worker needs the run's config
            self.phase = "register"
            try:
                await workflow.execute_activity(REGISTER_RUN, RunRegistration(cfg.run_id, cfg.run_argv),
                                                task_queue=cfg.rollout_task_queue, **_short(120))
            except ActivityError as e:  # the run's flags are bad: say what the check said, as the message
                raise _final(root_message(e)) from e
        await self._find_recorded_steps()
        prefetch = self.prefetch
        steps_this_run = 0
        if self.state.step < cfg.num_rollout:  # attaching syncs the servers: no rollout before that
            await self._with_trainer("attach", _attached)
            if cfg.fully_async:
                self.pool = self._make_pool()
        while self.state.step < cfg.num_rollout:
            step = self.state.step
            if self.pool is None:
                for s in range(step, min(cfg.num_rollout, step + cfg.max_staleness + 1)):
                    if s not in prefetch:  # started in order, so prompt positions are claimed in order
                        prefetch[s] = asyncio.create_task(self._prepare(s, self.state.weight_version))
            self.phase = "rollout"
            t0 = workflow.time()
            prepared = await self._await_rollouts(self._take(step) if self.pool else prefetch.pop(step))
            t1 = workflow.time()
            metrics = await self._train(step)
            self.state.step = step + 1
            t2 = workflow.time()
            sync = await self._sync()
            if self.pool:
                self.pool.synced()
                metrics.update(self.async_metrics.pop(step, {}), rollouts_in_flight=len(self.pool.in_flight))
            metrics.update(step=step, weight_version=self.state.weight_version, rollouts=prepared.rollouts,
                           failed_samples=prepared.failed_samples,
                           rollout_wait_seconds=t1 - t0, train_phase_seconds=t2 - t1,
                           sync_seconds=workflow.time() - t2, sync_pause_seconds=sync.get("pause_seconds", 0.0),
                           finished_at=workflow.now().timestamp(),
                           **{f"sync_{k}": sync[k] for k in ("wire_bytes", "changed", "total") if k in sync})
            self.state.metrics = (self.state.metrics + [metrics])[-KEEP_METRICS:]
            await self._record_metrics(step, metrics)
            if cfg.save and (self.state.step % (cfg.save_interval or cfg.num_rollout) == 0
                             or self.state.step == cfg.num_rollout):
                await self._checkpoint()
            workflow.upsert_search_attributes([POLICY_VERSION.value_set(self.state.weight_version)])
            steps_this_run += 1
            if self.state.step < cfg.num_rollout and self._continue_as_new_due(steps_this_run):
                self.phase = "continue-as-new"
                # each records its manifest: the next run trains it
                await self._await_rollouts(asyncio.gather(*prefetch.values()))
                if self.pool:  # the groups in flight finish; the next run gets them with its input
                    self.state.queued = await self.pool.drain()
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(TrainingInput(cfg, self.state))
        if self.pool:  # spares started for filtered or dropped groups: not trained, counted
            if self.state.metrics:
                self.state.metrics[-1]["groups_cancelled"] = len(self.pool.in_flight)
            await self.pool.cancel()
        await self._release_trainer()
        self.phase = "done"
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("done")])
        return self.state

    async def _release_trainer(self) -> None:
        """Free the trainer this run picked last for the next run at once (else its lease runs out;
        also when its attach failed). A trainer the run lost is not asked (it is gone, and asking
        a dead queue would hold the run's end up until the schedule-to-start timeout)."""
        queue, self.leased = self.leased, None
        if queue is None or not workflow.patched(RELEASE_TRAINER_PATCH):
            return
        try:
            await workflow.execute_activity("release_trainer", self.cfg.run_id, task_queue=queue,
                                            schedule_to_start_timeout=timedelta(seconds=30), **_short(30),
                                            retry_policy=RetryPolicy(maximum_attempts=1))
        except ActivityError as e:
            workflow.logger.warning("release_trainer %s: %s", queue, e.cause)

    async def _record_metrics(self, step: int, metrics: dict) -> None:
        """`<run_dir>/metrics.jsonl` gets the step's line. A run whose history predates this call
        replays without it (the patch); a failed write is logged, never the run's failure."""
        if not workflow.patched(METRICS_FILE_PATCH):
            return
        try:
            await workflow.execute_local_activity(RECORD_METRICS, StepMetrics(self.cfg.run_id, step, metrics),
                                                  **_short(60), retry_policy=RetryPolicy(maximum_attempts=3))
        except ActivityError as e:
            workflow.logger.warning(f"step {step}'s metrics were not written to metrics.jsonl: {_message(e.cause or e)}")

    def _continue_as_new_due(self, steps_this_run: int) -> bool:
        every = self.cfg.continue_as_new_after_steps
        return (every > 0 and steps_this_run >= every) or workflow.info().is_continue_as_new_suggested()

    # ---- steps -------------------------------------------------------------------------------

    async def _find_recorded_steps(self) -> None:
        """Steps whose manifest is already in the store (handed over by continue-as-new, or
        collected by a failed run of this workflow id): they are trained, not collected again."""
        cfg = self.cfg
        found = await workflow.execute_activity(
            RECORDED_STEPS, RecordedStepsInput(cfg.run_id, self.state.step, gap=cfg.max_staleness + 1),
            result_type=list[RecordedStep], task_queue=cfg.rollout_task_queue, **_short(300),
            retry_policy=rollout_retry_policy())
        self.recorded = {r.step: r for r in found}
        if found:
            self.state.data_position = max(self.state.data_position, *(r.next_position for r in found))

    async def _await_rollouts(self, pending: Awaitable[T]) -> T:
        """Wait for a step's rollouts (`pending`). A trainer lost meanwhile is re-attached now, not
        when the step trains: a relaunch (after SIGTERM, Ctrl-C or kill -9 of the launcher) brings
        servers up on the base checkpoint, and attaching pushes the run's policy to them. Until
        then the groups sampled there fail as stale (`vime.rollout.policy_check`) and are sampled
        again: no step trains on the wrong weights, and none waits for its trainer call to find out."""
        task = asyncio.ensure_future(pending)
        try:
            while not task.done():  # no wait at all when it is done: the same commands, in the same order
                await workflow.wait_condition(lambda: task.done() or self.trainer is None)
                if task.done() or not workflow.patched(RESYNC_PATCH):
                    break
                await self._with_trainer("attach", _attached)
                self.phase = "rollout"
            return await task
        except asyncio.CancelledError:  # the run is cancelled: so are its rollouts, as when awaited directly
            task.cancel()
            raise

    async def _prepare(self, step: int, weight_version: int) -> RecordedStep:
        """The step's manifest: recorded earlier, or collected now and recorded."""
        if step in self.recorded:
            return self.recorded.pop(step)
        failures = StepFailures(self.cfg.max_failed_sample_ratio) if workflow.patched(HOOK_FAILURES_PATCH) else None
        groups = await self._collect(step, weight_version, failures)
        if failures is not None and failures.over_bound():
            raise _final(failures.stop_message(step))
        extra = {"failed_samples": failures.failed, "first_failure": failures.first_error} if failures else None
        return await self._record(step, groups, weight_version, extra)

    async def _take(self, step: int) -> RecordedStep:
        """Fully async: the step's groups as they finished, within the staleness bound."""
        self.next_take = step + 1
        if step in self.recorded:
            return self.recorded.pop(step)
        try:
            taken = await self.pool.take()
        except NothingToTrain as e:
            raise _final(f"step {step}: no rollout group to train on ({e}); check --dynamic-sampling-filter-path")
        staleness = taken.staleness
        self.async_metrics[step] = {"staleness_mean": sum(staleness) / len(staleness),
                                    "staleness_max": max(staleness), "dropped_groups": taken.dropped}
        return await self._record(step, [g.out for g in taken.groups],
                                  min(g.weight_version for g in taken.groups),
                                  {"staleness": staleness, "dropped_groups": taken.dropped})

    def _make_pool(self) -> RolloutPool:
        cfg = self.cfg

        def claim() -> int:
            self.state.data_position += 1
            return self.state.data_position - 1

        pool_cfg = PoolConfig(cfg.rollout_batch_size, cfg.max_concurrent_rollouts or cfg.rollout_batch_size,
                              cfg.max_staleness, cfg.staleness_control,
                              max_filtered=cfg.max_filter_rounds * cfg.rollout_batch_size)
        queued, self.state.queued = self.state.queued, []
        self.next_take = self.state.step  # the first step whose groups the pool must provide
        return RolloutPool(pool_cfg, lambda position, version: self._rollout(self.state.step, position, version),
                           claim, lambda: cfg.num_rollout - self.next_take,
                           lambda: self.state.weight_version, queued)

    async def _record(self, step: int, groups: list[RolloutOutput], weight_version: int,
                      extra: dict | None = None) -> RecordedStep:
        """Check the step's groups and record its manifest (written once: a retry gets the first)."""
        self._check_step(step, groups)
        cfg = self.cfg
        meta = {"groups": len(groups), "samples": sum(g.samples for g in groups),
                "errors": sum(g.errors for g in groups), "positions": [g.position for g in groups][:64],
                **(extra or {})}
        record = StepRecord(cfg.run_id, step, [rid for g in groups for rid in g.rollout_ids], weight_version,
                            self.state.data_position, meta)
        return await workflow.execute_activity(
            RECORD_STEP, record, result_type=RecordedStep, task_queue=cfg.rollout_task_queue, **_short(300),
            retry_policy=rollout_retry_policy())

    def _check_step(self, step: int, groups: list[RolloutOutput]) -> None:
        """Never train on nothing: a step whose every sample failed is a configuration error (the
        hook or the engine rejects every request), and so is a step with no group at all."""
        samples = sum(g.samples for g in groups)
        errors = sum(g.errors for g in groups)
        if samples and errors == samples:
            first = next((g.first_error for g in groups if g.first_error), "no error message")
            raise _final(f"step {step}: every one of its {samples} samples failed, so there is nothing to train "
                         f"on; the first error: {first}")
        if not groups or not samples:
            raise _final(f"step {step}: no rollout group to train on (every group was filtered out in "
                         f"{self.cfg.max_filter_rounds} sampling rounds); check --dynamic-sampling-filter-path")

    # ---- rollouts ----------------------------------------------------------------------------

    async def _collect(self, step: int, weight_version: int,
                       failures: StepFailures | None = None) -> list[RolloutOutput]:
        """`rollout_batch_size` groups the dynamic-sampling filter kept (fewer if rounds run out).
        Groups with failed samples are not kept either: others are drawn in their place, each
        round's counted in `failures`, and a round whose every sample failed ends the step."""
        cfg = self.cfg
        if cfg.custom_rollout_function:
            return await self._collect_by_function(step, weight_version, failures)
        kept: list[RolloutOutput] = []
        for round_ in range(cfg.max_filter_rounds):
            want = cfg.rollout_batch_size - len(kept)
            count = cfg.over_sampling_batch_size if round_ == 0 else want
            positions = list(range(self.state.data_position, self.state.data_position + count))
            self.state.data_position += count
            outs = await asyncio.gather(*(self._rollout(step, p, weight_version) for p in positions))
            kept += [o for o in outs if o.keep]
            if failures is not None:
                failures.add(outs)
                if failures.all_failed():
                    return kept
            if len(kept) >= cfg.rollout_batch_size:
                return kept[: cfg.rollout_batch_size]
        workflow.logger.warning("step %d: only %d of %d groups passed the filter in %d rounds",
                                step, len(kept), cfg.rollout_batch_size, cfg.max_filter_rounds)
        return kept

    async def _collect_by_function(self, step: int, weight_version: int,
                                   failures: StepFailures | None = None) -> list[RolloutOutput]:
        """The user's rollout function owns the step: it pulls prompts from a data source at our
        position, and tells us where it stopped."""
        cfg = self.cfg
        try:
            out = await workflow.execute_activity(
                ROLLOUT_STEP, RolloutStepInput(cfg.run_id, step, self.state.data_position, weight_version,
                                               cfg.rollout_heartbeat_seconds),
                result_type=RolloutStepOutput, task_queue=cfg.rollout_task_queue,
                start_to_close_timeout=timedelta(hours=12),
                heartbeat_timeout=timedelta(seconds=cfg.rollout_heartbeat_seconds),
                retry_policy=rollout_retry_policy())
        except ActivityError as e:
            raise _final(f"step {step}: --rollout-function-path failed: {root_message(e)}") from e
        self.state.data_position = out.next_position
        if failures is not None:
            failures.add(out.groups)
        return [g for g in out.groups if g.keep]

    async def _rollout(self, step: int, position: int, weight_version: int) -> RolloutOutput:
        """One prompt group from the run's environment: its group workflow, started by the name the
        environment registered (`--rollout-env`), returns the group's rollout ids and summary."""
        cfg = self.cfg
        self.children_running += 1
        try:
            inp = RolloutInput(cfg.run_id, step, position, weight_version,
                               heartbeat_seconds=cfg.rollout_heartbeat_seconds, local_activity=cfg.local_activities,
                               n_samples_per_prompt=cfg.n_samples_per_prompt,
                               sandbox_task_queue=cfg.sandbox_task_queue)
            return await workflow.execute_child_workflow(
                cfg.rollout_workflow, inp, id=rollout_workflow_id(cfg.run_id, position), result_type=RolloutOutput,
                search_attributes=starting_search_attributes(inp))
        except ChildWorkflowError as e:  # infra failures retry inside; what reaches here is final
            if is_cancelled_exception(e):  # the run is being cancelled: it ends cancelled, not failed
                raise
            raise _final(f"rollout group {position} failed: {root_message(e)}") from e
        finally:
            self.children_running -= 1

    # ---- trainer -----------------------------------------------------------------------------

    async def _attach(self) -> TrainerInfo:
        """Pick a live trainer and bring it to `state.checkpoint_step`, then replay to `state.step`."""
        cfg = self.cfg
        self.phase = "attach"
        info = await workflow.execute_activity(
            "pick_trainer", PickInput(cfg.run_id), result_type=TrainerInfo, task_queue=cfg.trainer_task_queue,
            schedule_to_close_timeout=timedelta(hours=1),  # waiting out a busy trainer, checked every 10 s at most
            start_to_close_timeout=timedelta(seconds=30),  # an answer is instant: a lost attempt is tried again
            retry_policy=RetryPolicy(maximum_attempts=0, maximum_interval=timedelta(seconds=10)))
        self.leased = info.queue
        at = await workflow.execute_activity(
            "attach_trainer", AttachInput(cfg.run_id, self.state.checkpoint_step, self.state.checkpoint),
            result_type=int, task_queue=info.queue, schedule_to_start_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=cfg.trainer_heartbeat_seconds), **_short(3600),
            retry_policy=RetryPolicy(maximum_attempts=1))
        self.trainer = info
        for s in range(at, self.state.step):  # steps trained since the checkpoint, from their manifests
            await self._train_on(info, s)
        # The servers may hold other weights (a lost trainer's, another run's): push this policy
        # again under its own version. A new version would age every group in flight by one
        # without the policy having changed (a kill -9 of the trainer trained a group 2 versions
        # old under --max-staleness 1).
        await self._sync_on(info, self.state.weight_version)
        return info

    async def _with_trainer(self, phase: str, call):
        """Run `call(trainer)`; on a lost trainer (a timeout, `WorkerLost` from the launcher that
        saw it die, or a `trainer_lost` signal) re-attach and retry.

        An error the trainer raised is retried on a re-attached trainer a few times, then fails
        the run with the trainer's message: a bug or bad data does not fix itself by looping.
        """
        errors = 0
        while True:
            seen = self.trainer_losses
            attempt = asyncio.create_task(self._attempt(phase, call))
            await workflow.wait_condition(lambda: attempt.done() or self.trainer_losses != seen)
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
                    raise _final(f"{phase}: {root_message(e)}") from e
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

    async def _attempt(self, phase: str, call):
        info = self.trainer or await self._attach()
        self.phase = phase
        return await call(info)

    async def _train(self, step: int) -> dict:
        return await self._with_trainer("train", lambda info: self._train_on(info, step))

    async def _train_on(self, info: TrainerInfo, step: int) -> dict:
        return await workflow.execute_activity(
            "train_step", TrainInput(self.cfg.run_id, step), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), **_short(4 * 3600),
            heartbeat_timeout=timedelta(seconds=self.cfg.trainer_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=1))

    async def _sync(self) -> dict:
        """The step's sync, under a version fixed before the first try: a retry (a trainer-lost
        signal that lands after a sync went through, as on a rerun after Ctrl-C) pushes the same
        version again instead of bumping it twice for one step."""
        version = self.state.weight_version + 1
        return await self._with_trainer("sync", lambda info: self._sync_on(info, version))

    async def _sync_on(self, info: TrainerInfo, version: int) -> dict:
        """Push the trainer's weights to the servers as `version`."""
        report = await workflow.execute_activity(
            "sync_weights", SyncInput(version), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), **_short(3600),
            heartbeat_timeout=timedelta(seconds=self.cfg.trainer_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=1))
        self.state.weight_version = version
        return report

    async def _checkpoint(self) -> None:
        cfg = self.cfg

        async def save(info: TrainerInfo) -> str:
            return await workflow.execute_activity(
                "save_checkpoint",
                SaveInput(cfg.run_id, cfg.save, self.state.step, self.state.weight_version, self.state.data_position),
                result_type=str, task_queue=info.queue, schedule_to_start_timeout=timedelta(seconds=30),
                heartbeat_timeout=timedelta(seconds=cfg.trainer_heartbeat_seconds), **_short(3600),
                retry_policy=RetryPolicy(maximum_attempts=1))

        path = await self._with_trainer("checkpoint", save)
        self.state.checkpoint, self.state.checkpoint_step = path, self.state.step
