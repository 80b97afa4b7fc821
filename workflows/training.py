"""TrainingWorkflow (`train-<run>`): finished rollouts in, update steps out.

Per rollout step: an eval round when one is due (`workflows.eval_round`), then gather
`rollout_batch_size` kept prompt groups from RolloutWorkflows, record the step's manifest in the
store (`record_step`: its rollout ids, written once), `train_step` on the trainer's own task
queue, `sync_weights` into the vLLM servers, and a checkpoint on schedule. The workflow is a consumer of a stream of finished rollouts: the rollouts of step s
may start while the policy is at most `max_staleness` versions behind step s;
`max_staleness=0` is synchronous on-policy training.

This module is the step loop; the steps' groups come from `workflows.step_collection`
(synchronous rounds with filters, a custom rollout function, or the async pool), the trainer
calls go through `workflows.trainer_session` (pick, attach, replay, sync, checkpoint, release),
and the workflow's contract (input, state, query and signal names) is
`vime.temporal.training_contract`, which the launcher uses without importing this module.

What travels through Temporal stays small whatever the batch size: the trainer gets
`(run, step)` and reads the step's manifest and samples from the store; the state holds
counters, the checkpoint and recent metrics, never sample refs.

Crash model:
- a rollout worker dies → its activities are retried elsewhere (at once when the launcher saw
  the death, `vime.launcher.recovery`; else on heartbeat timeout); the store write is idempotent;
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

A start never retrains what the store recorded (`workflows.durable_start`): a run the store says
finished completes at once with its finished state, training nothing (a second Start Workflow in
the Web UI, or `temporal workflow start` again, with Temporal's default id-reuse policy), and an
input state behind the store's trained steps resumes where the store says the run stands.

Continue-as-new (when Temporal suggests it, or every `continue_as_new_after_steps` steps): no
new rollouts start, the prefetched steps in flight finish and record their manifests, and the
next run finds them with `recorded_steps`: nothing is lost or collected twice.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, FailureError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import failure_message, final_error, own_message, root_message
    from vime.temporal.search_attributes import POLICY_VERSION, ROLLOUT_STATUS, RUN_ID
    # The contract moved to vime.temporal.training_contract (vime/ no longer imports workflows/);
    # re-exported here for the modules that still import it from this one.
    from vime.temporal.training_contract import (NOTICE_SIGNAL, PROGRESS_QUERY, TRAINER_LOST_SIGNAL,
                                                 TRAINING_WORKFLOW, TrainingConfig, TrainingInput, TrainingState)
    from workflows.eval_beside import EvalBeside
    from workflows.eval_round import EvalRounds
    from workflows.step_collection import StepCollection
    # Temporal decodes an activity's result by its dataclass's type hints, evaluated in the
    # dataclass's module as this workflow's sandbox sees it; a module only imported by the
    # passed-through helpers is not there (`RolloutStepOutput.groups: list[RolloutOutput]` failed
    # to decode, and a --rollout-function-path run hung). So every module whose dataclasses this
    # workflow receives is imported here.
    import vime.temporal.group_contract  # noqa: F401
    import workflows.rollout  # noqa: F401
    import workflows.trainer_calls  # noqa: F401
    from vime.temporal.retry import rollout_retry_policy
    from workflows.durable_start import finished_line, finished_record, finished_state, resume_point
    from workflows.steps import (RECORD_FINISHED, RECORD_METRICS, REGISTER_RUN, RUN_RECORD, FinishedRun,
                                 RunRecord, RunRegistration, StepMetrics)
    from workflows.trainer_session import TrainerSession

__all__ = ["TrainingWorkflow", "TrainingConfig", "TrainingInput", "TrainingState", "failure_message",
           "root_message"]

KEEP_METRICS = 100
METRICS_FILE_PATCH = "metrics-jsonl"  # workflows recorded before metrics.jsonl replay without it
REGISTER_RUN_PATCH = "register-run"  # workflows recorded before runs carried their flags
RESYNC_PATCH = "resync-while-collecting"  # workflows recorded before a lost trainer was re-attached at once
DURABLE_START_PATCH = "durable-start"  # workflows recorded before a start read the store's record of its run
RECORD_FINISHED_PATCH = "record-finished"  # workflows recorded before a run's end was recorded in the store
KEEP_NOTICES = 20
T = TypeVar("T")


SYNC_METRICS = ("wire_bytes", "full_bytes", "changed", "total", "held", "probe_max_abs_diff")  # `sync_<key>` per step


# Outside Temporal's sandbox, as RolloutWorkflow: tests/test_unsandboxed_workflows.py says why and
# checks in the source what the sandbox checked at run time.
@workflow.defn(name=TRAINING_WORKFLOW, sandboxed=False)
class TrainingWorkflow:
    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.phase = "starting"
        self.trainer = TrainerSession(self._set_phase)  # pick, attach, train, sync, checkpoint, release
        self.rollouts = StepCollection()  # sync rounds, custom rollout function, or the async pool
        self.evals = EvalRounds()  # eval rounds at step boundaries (--eval-interval)
        self.beside = EvalBeside(self.evals, self.trainer, self.rollouts, self._record_line)  # fully async
        self.notices: list[dict] = []  # the latest lines workers sent for the console (`notice`)

    def _set_phase(self, phase: str) -> None:
        self.phase = phase

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> dict:
        return {"step": self.state.step, "num_rollout": self.cfg.num_rollout if self.cfg else None,
                "phase": self.phase, "weight_version": self.state.weight_version,
                "data_position": self.state.data_position, "checkpoint_step": self.state.checkpoint_step,
                "checkpoint": self.state.checkpoint, "held_syncs": self.state.held_syncs,
                "metrics": self.state.metrics[-KEEP_METRICS:],
                "notices": self.notices}

    @workflow.signal(name=NOTICE_SIGNAL)
    def notice(self, line: str) -> None:
        """A line for the console from a worker (a hook the run waits on: `activities.hook_notices`);
        `vime train` prints it from `progress`."""
        self.notices = (self.notices + [{"at": workflow.now().timestamp(), "line": line}])[-KEEP_NOTICES:]

    @workflow.signal(name=TRAINER_LOST_SIGNAL)
    def trainer_lost(self) -> None:
        """The launcher saw the trainer's process die, or started the run anew after its launcher
        died: whatever trainer call is pending is abandoned and a live trainer attached now,
        instead of after a heartbeat or schedule-to-start timeout."""
        self.trainer.lost()

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingState:
        """Train `num_rollout` steps. A cancel (`vime cancel`, the Web UI, `temporal workflow
        cancel`) cancels the rollouts in flight and waits for their cleanup (an agent rollout tears
        its sandbox down) before the run ends as cancelled."""
        try:
            return await self._run(inp)
        except FailureError as e:  # the run fails (a cancel is handled below): free its trainer for others
            if not is_cancelled_exception(e):
                await self.trainer.release()
                raise
            await self._cancel()
            raise
        except asyncio.CancelledError:
            await self._cancel()
            raise

    async def _run(self, inp: TrainingInput) -> TrainingState:
        """The step loop: an eval round when due, collect a step's groups, train, sync, record,
        checkpoint; continue as new when the history grows long; a last eval round."""
        cfg, self.cfg, self.state = inp.config, inp.config, inp.state
        self.trainer.begin(cfg, self.state)
        self.rollouts.begin(cfg, self.state)
        self.evals.begin(cfg, self.state)
        self.beside.begin(cfg, self.state)
        workflow.upsert_search_attributes([RUN_ID.value_set(cfg.run_id), ROLLOUT_STATUS.value_set("training")])
        await self._register_run()
        if (finished := await self._durable_start()) is not None:
            return finished
        await self.rollouts.find_recorded()
        steps_this_run = 0
        if self.state.step < cfg.num_rollout:  # attaching syncs the servers: no rollout before that
            await self.trainer.attach()
            if cfg.fully_async:
                self.rollouts.start_pool()
        while self.state.step < cfg.num_rollout:
            step = self.state.step
            evaluated = await self._evaluate(step)
            self.phase = "rollout"
            t0 = workflow.time()
            await self.beside.before_take()
            prepared = await self._await_rollouts(self.rollouts.collect(step))
            t1 = workflow.time()
            metrics = await self.trainer.train(step)
            self.state.step = step + 1
            t2 = workflow.time()
            sync = await self.beside.sync()
            metrics.update(self.rollouts.synced(step))
            metrics.update(step=step, weight_version=self.state.weight_version, rollouts=prepared.rollouts,
                           failed_samples=prepared.failed_samples,
                           rollout_wait_seconds=t1 - t0, train_phase_seconds=t2 - t1,
                           sync_seconds=workflow.time() - t2, sync_pause_seconds=sync.get("pause_seconds", 0.0),
                           finished_at=workflow.now().timestamp(),
                           **{f"sync_{k}": sync[k] for k in SYNC_METRICS if k in sync},
                           **evaluated)
            await self.beside.record(step, metrics)
            if cfg.save and (self.state.step % (cfg.save_interval or cfg.num_rollout) == 0
                             or self.state.step == cfg.num_rollout):
                await self.beside.unhold()  # a checkpoint holds the weights of its version
                await self.trainer.checkpoint()
            workflow.upsert_search_attributes([POLICY_VERSION.value_set(self.state.weight_version)])
            steps_this_run += 1
            if self.state.step < cfg.num_rollout and self._continue_as_new_due(steps_this_run):
                await self._continue_as_new()
        await self.rollouts.finish()
        await self.beside.settle()
        if final := await self._evaluate(cfg.num_rollout):  # after the last step
            await self._record_metrics(cfg.num_rollout, self._keep_metrics(
                {"step": cfg.num_rollout, "eval_only": True, "weight_version": self.state.weight_version,
                 "finished_at": workflow.now().timestamp(), **final}))
        await self.trainer.release()
        await self._record_finished()
        self.phase = "done"
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("done")])
        return self.state

    async def _record_line(self, step: int, metrics: dict) -> None:
        await self._record_metrics(step, self._keep_metrics(metrics))

    def _keep_metrics(self, metrics: dict) -> dict:
        self.state.metrics = (self.state.metrics + [metrics])[-KEEP_METRICS:]
        return metrics

    async def _evaluate(self, step: int) -> dict:
        """The eval round at the boundary before training step `step` (`num_rollout`: after the
        last), when one is due: every eval sample from the weights of the sync before it, the
        policy the run stands at (`workflows.eval_round`); its figures go in the step's metrics.
        In fully async mode a round before a step starts beside the step loop, which trains on
        meanwhile with its syncs held (`workflows.eval_beside`); its figures join the step's line."""
        if not self.evals.due(step):
            return {}
        if step < self.cfg.num_rollout and self.beside.applies():  # fully async: the trainer goes on
            await self.beside.start(step)
            return {}
        self.phase = "eval"
        return await self._await_rollouts(self.evals.run(step))

    async def _register_run(self) -> None:
        """Record the run's flags in the store, before any worker needs the run's config."""
        cfg = self.cfg
        if cfg.run_argv and workflow.patched(REGISTER_RUN_PATCH):
            self.phase = "register"
            try:
                await workflow.execute_activity(REGISTER_RUN, RunRegistration(cfg.run_id, cfg.run_argv),
                                                task_queue=cfg.rollout_task_queue,
                                                start_to_close_timeout=timedelta(seconds=120))
            except ActivityError as e:  # the run's flags are bad: say what the check said, as the message
                raise final_error(root_message(e)) from e

    async def _durable_start(self) -> TrainingState | None:
        """Start where the store says the run stands (`workflows.durable_start`): the finished
        state when the run already finished (then nothing is trained and no trainer attached);
        else None, the state moved past the steps the store records as trained when the input
        was behind them. A continue-as-new's input is this workflow's own state: not checked."""
        if workflow.info().continued_run_id is not None or not workflow.patched(DURABLE_START_PATCH):
            return None
        record = await workflow.execute_activity(
            RUN_RECORD, self.cfg.run_id, result_type=RunRecord, task_queue=self.cfg.rollout_task_queue,
            start_to_close_timeout=timedelta(seconds=120), retry_policy=rollout_retry_policy())
        finished = finished_state(record)
        if finished is not None:
            self.state, self.phase = finished, "done"
            self._tell(finished_line(self.cfg, finished))
            workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("done")])
            return finished
        resume = resume_point(self.cfg, self.state, record)
        if resume is not None:  # in place: the trainer session, step collection and eval rounds hold this state
            self.state.step, self.state.weight_version = resume.step, resume.weight_version
            self.state.data_position = resume.data_position
            self.state.checkpoint_step, self.state.checkpoint = resume.checkpoint_step, resume.checkpoint
            self._tell(resume.line)
        return None

    async def _record_finished(self) -> None:
        """The store records the run's end: a later start of it trains nothing (`_durable_start`)."""
        if workflow.patched(RECORD_FINISHED_PATCH):
            await workflow.execute_activity(
                RECORD_FINISHED, FinishedRun(self.cfg.run_id, finished_record(self.state)),
                task_queue=self.cfg.rollout_task_queue, start_to_close_timeout=timedelta(seconds=120),
                retry_policy=rollout_retry_policy())

    def _tell(self, line: str) -> None:
        """A line about the whole run, for every place a user looks: the console and `vime status`
        (the `progress` query's notices, the memo once it ended), the Web UI (memo, details)."""
        self.notice(line)
        workflow.upsert_memo({"notice": line})
        workflow.set_current_details(line)
        workflow.logger.warning(line)

    async def _continue_as_new(self) -> None:
        """No new rollouts start; the steps collected ahead finish and record their manifests (the
        next run trains them), the async pool's groups in flight finish and travel in the input."""
        self.phase = "continue-as-new"
        await self.beside.settle()
        await self._await_rollouts(self.rollouts.prefetched())
        await self.rollouts.hand_over()
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(TrainingInput(self.cfg, self.state))

    async def _cancel(self) -> None:
        """The run is being cancelled: cancel the rollouts in flight, wait for their cleanup, free
        the trainer."""
        self.phase = "cancelling"
        await self.rollouts.cancel()
        await self.beside.cancel()
        await workflow.wait_condition(lambda: self.evals.running == 0)
        await self.trainer.release()
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("cancelled")])

    async def _record_metrics(self, step: int, metrics: dict) -> None:
        """`<run_dir>/metrics.jsonl` gets the step's line. A run whose history predates this call
        replays without it (the patch); a failed write is logged, never the run's failure."""
        if not workflow.patched(METRICS_FILE_PATCH):
            return
        try:
            await workflow.execute_local_activity(RECORD_METRICS, StepMetrics(self.cfg.run_id, step, metrics),
                                                  start_to_close_timeout=timedelta(seconds=60),
                                                  retry_policy=RetryPolicy(maximum_attempts=3))
        except ActivityError as e:
            workflow.logger.warning(
                f"step {step}'s metrics were not written to metrics.jsonl: {own_message(e.cause or e)}")

    def _continue_as_new_due(self, steps_this_run: int) -> bool:
        every = self.cfg.continue_as_new_after_steps
        return (every > 0 and steps_this_run >= every) or workflow.info().is_continue_as_new_suggested()

    async def _await_rollouts(self, pending: Awaitable[T]) -> T:
        """Wait for a step's rollouts (`pending`). A trainer lost meanwhile is re-attached now, not
        when the step trains: a relaunch (after SIGTERM, Ctrl-C or kill -9 of the launcher) brings
        servers up on the base checkpoint, and attaching pushes the run's policy to them. Until
        then the groups sampled there fail as stale (`vime.rollout.policy_check`) and are sampled
        again: no step trains on the wrong weights, and none waits for its trainer call to find out."""
        task = asyncio.ensure_future(pending)
        try:
            while not task.done():  # no wait at all when it is done: the same commands, in the same order
                await workflow.wait_condition(lambda: task.done() or not self.trainer.attached)
                if task.done() or not workflow.patched(RESYNC_PATCH):
                    break
                await self.trainer.attach()
                self.phase = "rollout"
            return await task
        except asyncio.CancelledError:  # the run is cancelled: so are its rollouts, as when awaited directly
            task.cancel()
            raise
