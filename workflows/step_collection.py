"""Step collection: the prompt groups each training step trains on, and its recorded manifest.

Three ways to fill a step, all ending in `record_step` (the step's rollout ids, written once in
the store; the trainer reads them from there):

- synchronous rounds (the default): `rollout_batch_size` kept groups from child group workflows
  of the run's environment (`--rollout-env`), drawing more rounds while the dynamic-sampling
  filter drops groups (`max_filter_rounds`) or a hook fails samples (`workflows.failures`); the
  next `max_staleness` steps are collected ahead (prefetch) while the current one trains;
- a custom `--rollout-function-path`: the user's function owns the step (one activity);
- fully async (`--fully-async`): a pool of groups always in flight, steps in finish order under
  the staleness bound (`workflows.async_pool`, its rules in `workflows.staleness`).

A step already recorded (handed over by continue-as-new, or collected by a failed run of this
workflow id) is trained on its manifest, not collected again (`recorded_steps`).

Runs inside the TrainingWorkflow: deterministic, light imports only; the child workflows and
activities it starts, and their order, are the workflow's history (tests/test_replay.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import final_error, root_message
    from vime.temporal.training_contract import TrainingConfig, TrainingState
    from workflows.async_pool import NothingToTrain, PoolConfig, RolloutPool, TooManyFailed
    from workflows.failures import StepFailures
    from vime.envs.group_workflow import group_workflow_id as rollout_workflow_id
    from vime.envs.group_workflow import starting_search_attributes
    from vime.temporal.activity_bounds import rollout_activity_options, rollout_heartbeat_seconds
    from workflows.rollout import ROLLOUT_STEP, RolloutInput, RolloutOutput, RolloutStepInput, RolloutStepOutput
    from workflows.steps import RECORD_STEP, RECORDED_STEPS, RecordedStep, RecordedStepsInput, StepRecord

HOOK_FAILURES_PATCH = "hook-failures"  # workflows recorded before failed groups were counted and replaced
POOL_STEP_PATCH = "pool-step-accounting"  # fully async histories from before: the old refill, no failure bound


def mean_perf(groups: list[RolloutOutput]) -> dict[str, float]:
    """The step's rollout phases for its manifest (`bench/step_profile.py` reads them): each
    phase's seconds, the mean over the groups that timed it."""
    seen: dict[str, list[float]] = {}
    for g in groups:
        for phase, seconds in (g.perf or {}).items():
            seen.setdefault(phase, []).append(seconds)
    return {phase: round(sum(v) / len(v), 4) for phase, v in sorted(seen.items())}

class StepCollection:
    """The run's rollouts: what is in flight (prefetched steps, the async pool, child workflows)
    and the steps found recorded. `cfg` and `state` are the workflow's own (collection advances
    `state.data_position`; the pool reads `state.weight_version`)."""

    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.recorded: dict[int, RecordedStep] = {}
        self.prefetch: dict[int, asyncio.Task[RecordedStep]] = {}  # synchronous: steps being collected
        self.pool: RolloutPool | None = None  # fully async mode
        self.async_metrics: dict[int, dict] = {}  # fully async: staleness of each step taken
        self.next_take = 0  # fully async: the next step to take groups for
        self.children_running = 0  # rollout workflows started and not yet ended

    def begin(self, cfg: TrainingConfig, state: TrainingState) -> None:
        self.cfg, self.state = cfg, state

    # ---- the step loop's calls ---------------------------------------------------------------

    async def find_recorded(self) -> None:
        """Steps whose manifest is already in the store (handed over by continue-as-new, or
        collected by a failed run of this workflow id): they are trained, not collected again."""
        cfg = self.cfg
        found = await workflow.execute_activity(
            RECORDED_STEPS, RecordedStepsInput(cfg.run_id, self.state.step, gap=cfg.max_staleness + 1),
            result_type=list[RecordedStep], task_queue=cfg.rollout_task_queue,
            **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(seconds=300)))
        self.recorded = {r.step: r for r in found}
        if found:
            self.state.data_position = max(self.state.data_position, *(r.next_position for r in found))

    def start_pool(self) -> None:
        """Fully async: start keeping groups in flight (once a trainer has synced the servers)."""
        cfg = self.cfg

        def claim() -> int:
            self.state.data_position += 1
            return self.state.data_position - 1

        pool_cfg = PoolConfig(cfg.rollout_batch_size, cfg.max_concurrent_rollouts or cfg.rollout_batch_size,
                              cfg.max_staleness, cfg.staleness_control,
                              max_filtered=cfg.max_filter_rounds * cfg.rollout_batch_size,
                              max_failed_sample_ratio=cfg.max_failed_sample_ratio)
        queued, self.state.queued = self.state.queued, []
        self.next_take = self.state.step  # the first step whose groups the pool must provide
        self.pool = RolloutPool(pool_cfg, lambda position, version: self._rollout(self.state.step, position, version),
                                claim, lambda: cfg.num_rollout - self.next_take,
                                lambda: self.state.weight_version, queued, lambda: self.state.trainer_version)

    def collect(self, step: int) -> Awaitable[RecordedStep]:
        """The step's manifest, to await. Synchronous mode first starts collecting the steps up to
        `max_staleness` ahead (in order, so prompt positions are claimed in order)."""
        if self.pool:
            return self._take(step)
        cfg = self.cfg
        for s in range(step, min(cfg.num_rollout, step + cfg.max_staleness + 1)):
            if s not in self.prefetch:
                self.prefetch[s] = asyncio.create_task(self._prepare(s, self.state.weight_version))
        return self.prefetch.pop(step)

    def synced(self, step: int) -> dict:
        """The step's weights are on the servers (or held beside an eval round): its groups leave
        the pool's staleness budget.
        Returns the step's collection metrics (fully async: staleness, groups in flight)."""
        if not self.pool:
            return {}
        self.pool.synced()
        return {**self.async_metrics.pop(step, {}), "rollouts_in_flight": len(self.pool.in_flight)}

    def refill(self) -> None:
        """Held weights were pushed (`workflows.eval_beside`): the pool may start groups again."""
        if self.pool:
            self.pool.synced()

    def prefetched(self) -> Awaitable[list[RecordedStep]]:
        """The steps collected ahead (continue-as-new: each records its manifest, the next run trains it)."""
        return asyncio.gather(*self.prefetch.values())

    async def hand_over(self) -> None:
        """Continue-as-new: the pool's groups in flight finish; the next run gets them with its input."""
        if self.pool:
            self.state.queued = await self.pool.drain()

    async def finish(self) -> None:
        """The run trained its last step: the spares started for filtered or dropped groups are
        cancelled (not trained, counted in the last step's metrics)."""
        if self.pool:
            if self.state.metrics:
                self.state.metrics[-1]["groups_cancelled"] = len(self.pool.in_flight)
            await self.pool.cancel()

    async def cancel(self) -> None:
        """The run is being cancelled: cancel the rollouts in flight and wait for their cleanup."""
        steps = list(self.prefetch.values())
        for task in steps:
            task.cancel()
        await asyncio.gather(*steps, return_exceptions=True)
        if self.pool:
            await self.pool.cancel()
        # A rollout closed with its parent is terminated, its cleanup cut: wait for each to end.
        await workflow.wait_condition(lambda: self.children_running == 0)

    # ---- a step's manifest -------------------------------------------------------------------

    async def _prepare(self, step: int, weight_version: int) -> RecordedStep:
        """The step's manifest: recorded earlier, or collected now and recorded."""
        if step in self.recorded:
            return self.recorded.pop(step)
        failures = StepFailures(self.cfg.max_failed_sample_ratio) if workflow.patched(HOOK_FAILURES_PATCH) else None
        groups = await self._collect(step, weight_version, failures)
        if failures is not None and failures.over_bound():
            raise final_error(failures.stop_message(step))
        extra = {"failed_samples": failures.failed, "first_failure": failures.first_error} if failures else None
        return await self._record(step, groups, weight_version, extra)

    async def _take(self, step: int) -> RecordedStep:
        """Fully async: the step's groups as they finished, within the staleness bound."""
        self.next_take = step + 1
        if step in self.recorded:
            return self.recorded.pop(step)
        self.pool.counts_the_step_taken = workflow.patched(POOL_STEP_PATCH)
        try:
            taken = await self.pool.take()
        except TooManyFailed as e:
            raise final_error(e.args[0].stop_message(step))
        except NothingToTrain as e:
            raise final_error(f"step {step}: no rollout group to train on ({e}); check --dynamic-sampling-filter-path")
        staleness = taken.staleness
        self.async_metrics[step] = {"staleness_mean": sum(staleness) / len(staleness),
                                    "staleness_max": max(staleness), "dropped_groups": taken.dropped}
        failed = ({"failed_samples": taken.failures.failed, "first_failure": taken.failures.first_error}
                  if taken.failures is not None else {})
        return await self._record(step, [g.out for g in taken.groups],
                                  min(g.weight_version for g in taken.groups),
                                  {"staleness": staleness, "dropped_groups": taken.dropped, **failed})

    async def _record(self, step: int, groups: list[RolloutOutput], weight_version: int,
                      extra: dict | None = None) -> RecordedStep:
        """Check the step's groups and record its manifest (written once: a retry gets the first)."""
        self._check_step(step, groups)
        cfg = self.cfg
        meta = {"groups": len(groups), "samples": sum(g.samples for g in groups),
                "errors": sum(g.errors for g in groups), "positions": [g.position for g in groups][:64],
                **(extra or {})}
        if perf := mean_perf(groups):
            meta["perf"] = perf
        record = StepRecord(cfg.run_id, step, [rid for g in groups for rid in g.rollout_ids], weight_version,
                            self.state.data_position, meta)
        return await workflow.execute_activity(
            RECORD_STEP, record, result_type=RecordedStep, task_queue=cfg.rollout_task_queue,
            **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(seconds=300)))

    def _check_step(self, step: int, groups: list[RolloutOutput]) -> None:
        """Never train on nothing: a step whose every sample failed is a configuration error (the
        hook or the engine rejects every request), and so is a step with no group at all."""
        samples = sum(g.samples for g in groups)
        errors = sum(g.errors for g in groups)
        if samples and errors == samples:
            first = next((g.first_error for g in groups if g.first_error), "no error message")
            raise final_error(f"step {step}: every one of its {samples} samples failed, so there is nothing to "
                              f"train on; the first error: {first}")
        if not groups or not samples:
            raise final_error(f"step {step}: no rollout group to train on (every group was filtered out in "
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
                **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(hours=12), capped=False))
        except ActivityError as e:
            raise final_error(f"step {step}: --rollout-function-path failed: {root_message(e)}") from e
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
                               heartbeat_seconds=rollout_heartbeat_seconds(cfg.rollout_heartbeat_seconds),
                               local_activity=cfg.local_activities,
                               n_samples_per_prompt=cfg.n_samples_per_prompt,
                               sandbox_task_queue=cfg.sandbox_task_queue)
            return await workflow.execute_child_workflow(
                cfg.rollout_workflow, inp, id=rollout_workflow_id(cfg.run_id, position), result_type=RolloutOutput,
                search_attributes=starting_search_attributes(inp))
        except ChildWorkflowError as e:  # infra failures retry inside; what reaches here is final
            if is_cancelled_exception(e):  # the run is being cancelled: it ends cancelled, not failed
                raise
            raise final_error(f"rollout group {position} failed: {root_message(e)}") from e
        finally:
            self.children_running -= 1
