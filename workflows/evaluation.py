"""EvalWorkflow (`eval-<run>`): `vime eval`'s run. Checkpoints in, one eval round each, out.

For each checkpoint in turn: the round at the checkpoint's step is planned (`eval_plan`); if it
is recorded already (the same `vime eval` run again, or resumed after the round), its figures
are taken as they are. Otherwise the checkpoint's weights are loaded into the rollout servers as
its policy version (`load_checkpoint`), then the round runs exactly as it does inside a training
run (`workflows.eval_round.EvalRounds`): one child group workflow per eval prompt with a
deterministic id, every sample checked to carry the checkpoint's version, stored once, the
figures recorded once. Checkpoints are evaluated one after the other, so the servers hold one
policy at a time.

A new launch of the same command attaches to this workflow and signals `SERVERS_LOST_SIGNAL`
(its servers are fresh, on the base weights): the checkpoint being evaluated is loaded again
while its groups, sampled meanwhile from other weights, fail the version check and are sampled
again.

Workflow code: deterministic, light imports only.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from vime.temporal.error_types import own_message
    from vime.temporal.eval_contract import (EVAL_WORKFLOW, LOAD_CHECKPOINT, SERVERS_LOST_SIGNAL, EvalCheckpoint,
                                             EvalRunInput, LoadCheckpointInput)
    from vime.temporal.retry import rollout_retry_policy
    from vime.temporal.search_attributes import EVAL, ROLLOUT_STATUS, RUN_ID
    from vime.temporal.training_contract import PROGRESS_QUERY, TrainingConfig, TrainingState
    from workflows.eval_round import EvalRounds
    import vime.temporal.group_contract  # noqa: F401 - dataclasses the rounds receive (see training.py)
    import workflows.rollout  # noqa: F401
    from workflows.steps import RECORD_METRICS, REGISTER_RUN, RunRegistration, StepMetrics


@workflow.defn(name=EVAL_WORKFLOW)
class EvalWorkflow:
    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.evals = EvalRounds()
        self.checkpoints: list[EvalCheckpoint] = []
        self.metrics: list[dict] = []  # one line per evaluated checkpoint
        self.phase = "starting"
        self.reload = False  # the servers were replaced: load the current checkpoint again
        self.loaded = False  # the current checkpoint's weights were pushed

    @workflow.query(name=PROGRESS_QUERY)
    def progress(self) -> dict:
        return {"step": len(self.metrics), "num_rollout": len(self.checkpoints), "phase": self.phase,
                "metrics": self.metrics, "notices": []}

    @workflow.signal(name=SERVERS_LOST_SIGNAL)
    def servers_lost(self) -> None:
        self.reload = True

    @workflow.run
    async def run(self, inp: EvalRunInput) -> TrainingState:
        cfg, self.cfg, self.checkpoints = inp.config, inp.config, inp.checkpoints
        workflow.upsert_search_attributes([RUN_ID.value_set(cfg.run_id), EVAL.value_set(True),
                                           ROLLOUT_STATUS.value_set("evaluating")])
        if cfg.run_argv:
            await workflow.execute_activity(REGISTER_RUN, RunRegistration(cfg.run_id, cfg.run_argv, evaluation=True),
                                            task_queue=cfg.rollout_task_queue,
                                            start_to_close_timeout=timedelta(seconds=120))
        for checkpoint in inp.checkpoints:
            self.phase = f"eval {checkpoint.label}"
            figures = await self._evaluate(checkpoint)
            line = {"step": checkpoint.step, "eval_only": True, "eval_checkpoint": checkpoint.label,
                    "weight_version": checkpoint.weight_version, "finished_at": workflow.now().timestamp(), **figures}
            self.metrics.append(line)
            await self._record_metrics(line)
        self.phase = "done"
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("done")])
        last = inp.checkpoints[-1] if inp.checkpoints else EvalCheckpoint(0, "")
        return TrainingState(step=last.step, weight_version=last.weight_version, metrics=self.metrics)

    async def _evaluate(self, checkpoint: EvalCheckpoint) -> dict:
        """The checkpoint's round; its weights loaded first, and again whenever the servers are
        replaced while it runs."""
        self.evals.begin(self.cfg, TrainingState(step=checkpoint.step, weight_version=checkpoint.weight_version))
        self.loaded = False

        async def load() -> None:
            self.reload = False
            if checkpoint.path is not None:
                self.phase = f"loading {checkpoint.label}"
                await workflow.execute_activity(
                    LOAD_CHECKPOINT, LoadCheckpointInput(self.cfg.run_id, checkpoint.path, checkpoint.weight_version),
                    result_type=dict, task_queue=self.cfg.rollout_task_queue,
                    start_to_close_timeout=timedelta(minutes=30),
                    heartbeat_timeout=timedelta(seconds=self.cfg.rollout_heartbeat_seconds),
                    retry_policy=rollout_retry_policy())
                self.phase = f"eval {checkpoint.label}"
            self.loaded = True

        task = asyncio.ensure_future(self.evals.run(checkpoint.step, before=load))
        try:
            while not task.done():
                await workflow.wait_condition(lambda: task.done() or (self.reload and self.loaded))
                if task.done():
                    break
                await load()
            return await task
        except asyncio.CancelledError:
            task.cancel()
            raise

    async def _record_metrics(self, line: dict) -> None:
        """The checkpoint's line in the eval run's `metrics.jsonl`; a failed write is logged only."""
        try:
            await workflow.execute_local_activity(RECORD_METRICS, StepMetrics(self.cfg.run_id, line["step"], line),
                                                  start_to_close_timeout=timedelta(seconds=60),
                                                  retry_policy=RetryPolicy(maximum_attempts=3))
        except ActivityError as e:
            workflow.logger.warning(f"eval {line['eval_checkpoint']}'s metrics were not written: "
                                    f"{own_message(e.cause or e)}")
