"""TrainingWorkflow (`train-<run>`): finished rollouts in, update steps out.

Per rollout step: gather `rollout_batch_size` kept prompt groups from RolloutWorkflows,
`train_step` on the trainer's own task queue, `sync_weights` into the vLLM servers, and a
checkpoint on schedule. The workflow is a consumer of a stream of finished rollouts: the
rollouts of step s may start while the policy is at most `max_staleness` versions behind
step s; `max_staleness=0` is synchronous on-policy training.

Crash model:
- a rollout worker dies → its activity times out on heartbeat and retries elsewhere (the
  store write is idempotent);
- the trainer dies → its activities time out; the workflow picks another trainer, loads the
  last checkpoint into it, replays the steps trained since (their rollout refs are kept in the
  state, so no sample is generated or skipped anew: each is trained once more in the same
  step, on the same weights lineage), re-syncs the servers and goes on;
- the workflow's own worker dies → Temporal replays the history on another one.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from vime.temporal.search_attributes import POLICY_VERSION, ROLLOUT_STATUS, RUN_ID
    from vime.types import RolloutRef
    from workflows.rollout import (ROLLOUT_STEP, RolloutInput, RolloutOutput, RolloutStepInput,
                                   RolloutStepOutput, RolloutWorkflow, rollout_workflow_id)
    from workflows.coding_agent import (AgentRolloutInput, CodingAgentRolloutWorkflow,
                                        agent_workflow_id)


@dataclass
class TrainerInfo:
    queue: str
    step: int
    identity: str = ""


@dataclass
class AttachInput:
    run_id: str
    step: int  # the step the trainer must be at after attaching
    checkpoint: str | None = None


@dataclass
class TrainInput:
    run_id: str
    step: int
    rollouts: list[RolloutRef]


@dataclass
class SyncInput:
    engine_urls: list[str]
    weight_version: int


@dataclass
class SaveInput:
    run_id: str
    root: str
    step: int
    weight_version: int
    data_position: int


@dataclass
class TrainingConfig:
    run_id: str
    num_rollout: int
    rollout_batch_size: int
    over_sampling_batch_size: int
    engine_urls: list[str]
    trainer_task_queue: str = "vime-trainer"
    max_staleness: int = 0
    save: str | None = None
    save_interval: int | None = None
    trainer_heartbeat_seconds: float = 60.0
    rollout_heartbeat_seconds: float = 60.0
    max_filter_rounds: int = 16
    custom_rollout_function: bool = False  # --rollout-function-path replaces per-group workflows
    rollout_task_queue: str = "vime-rollout"
    rollout_workflow: str = "RolloutWorkflow"  # or "CodingAgentRolloutWorkflow": one workflow per rollout
    n_samples_per_prompt: int = 1
    sandbox_task_queue: str = "vime-sandbox"


@dataclass
class TrainingState:
    step: int = 0  # next rollout step to train
    data_position: int = 0  # next prompt position to hand out
    weight_version: int = 0
    checkpoint_step: int = 0
    checkpoint: str | None = None
    replay: dict[str, list[RolloutRef]] = field(default_factory=dict)  # steps trained since the checkpoint
    metrics: list[dict] = field(default_factory=list)  # the most recent steps' metrics


@dataclass
class TrainingInput:
    config: TrainingConfig
    state: TrainingState = field(default_factory=TrainingState)


KEEP_METRICS = 200
MAX_TRAINER_ERRORS = 3


async def _attached(info: TrainerInfo) -> TrainerInfo:
    return info


def _short(seconds: float) -> dict:
    return dict(start_to_close_timeout=timedelta(seconds=seconds))


@workflow.defn(name="TrainingWorkflow")
class TrainingWorkflow:
    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.trainer: TrainerInfo | None = None
        self.phase = "starting"

    @workflow.query
    def progress(self) -> dict:
        return {"step": self.state.step, "num_rollout": self.cfg.num_rollout if self.cfg else None,
                "phase": self.phase, "weight_version": self.state.weight_version,
                "data_position": self.state.data_position, "metrics": self.state.metrics[-KEEP_METRICS:]}

    @workflow.run
    async def run(self, inp: TrainingInput) -> TrainingState:
        cfg, self.cfg, self.state = inp.config, inp.config, inp.state
        workflow.upsert_search_attributes([RUN_ID.value_set(cfg.run_id), ROLLOUT_STATUS.value_set("training")])
        prefetch: dict[int, asyncio.Task[list[RolloutOutput]]] = {}
        if self.state.step < cfg.num_rollout:  # attaching syncs the servers: no rollout before that
            await self._with_trainer("attach", _attached)
        while self.state.step < cfg.num_rollout:
            step = self.state.step
            for s in range(step, min(cfg.num_rollout, step + cfg.max_staleness + 1)):
                if s not in prefetch:  # started in order, so prompt positions are claimed in order
                    prefetch[s] = asyncio.create_task(self._collect(s, self.state.weight_version))
            self.phase = "rollout"
            t0 = workflow.time()
            groups = await prefetch.pop(step)
            refs = [r for g in groups for r in g.rollouts]
            t1 = workflow.time()
            metrics = await self._train(step, refs)
            self.state.replay[str(step)] = refs
            self.state.step = step + 1
            t2 = workflow.time()
            sync = await self._sync()
            metrics.update(step=step, weight_version=self.state.weight_version, groups=len(groups),
                           rollout_wait_seconds=t1 - t0, train_phase_seconds=t2 - t1,
                           sync_seconds=workflow.time() - t2, sync_pause_seconds=sync.get("pause_seconds", 0.0))
            self.state.metrics = (self.state.metrics + [metrics])[-KEEP_METRICS:]
            if cfg.save and (self.state.step % (cfg.save_interval or cfg.num_rollout) == 0
                             or self.state.step == cfg.num_rollout):
                await self._checkpoint()
            workflow.upsert_search_attributes([POLICY_VERSION.value_set(self.state.weight_version)])
            if not prefetch and workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(TrainingInput(cfg, self.state))
        self.phase = "done"
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("done")])
        return self.state

    # ---- rollouts ----------------------------------------------------------------------------

    async def _collect(self, step: int, weight_version: int) -> list[RolloutOutput]:
        """`rollout_batch_size` groups the dynamic-sampling filter kept (fewer if rounds run out)."""
        cfg = self.cfg
        if cfg.custom_rollout_function:
            return await self._collect_by_function(step, weight_version)
        kept: list[RolloutOutput] = []
        for round_ in range(cfg.max_filter_rounds):
            want = cfg.rollout_batch_size - len(kept)
            count = cfg.over_sampling_batch_size if round_ == 0 else want
            positions = list(range(self.state.data_position, self.state.data_position + count))
            self.state.data_position += count
            outs = await asyncio.gather(*(self._rollout(step, p, weight_version) for p in positions))
            kept += [o for o in outs if o.keep]
            if len(kept) >= cfg.rollout_batch_size:
                return kept[: cfg.rollout_batch_size]
        workflow.logger.warning("step %d: only %d of %d groups passed the filter in %d rounds",
                                step, len(kept), cfg.rollout_batch_size, cfg.max_filter_rounds)
        return kept

    async def _collect_by_function(self, step: int, weight_version: int) -> list[RolloutOutput]:
        """The user's rollout function owns the step: it pulls prompts from a data source at our
        position, and tells us where it stopped."""
        cfg = self.cfg
        out = await workflow.execute_activity(
            ROLLOUT_STEP, RolloutStepInput(cfg.run_id, step, self.state.data_position, weight_version,
                                           cfg.rollout_heartbeat_seconds),
            result_type=RolloutStepOutput, task_queue=cfg.rollout_task_queue,
            start_to_close_timeout=timedelta(hours=12), heartbeat_timeout=timedelta(seconds=cfg.rollout_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=10, non_retryable_error_types=["ConfigError"]))
        self.state.data_position = out.next_position
        return [g for g in out.groups if g.keep]

    async def _rollout(self, step: int, position: int, weight_version: int) -> RolloutOutput:
        cfg = self.cfg
        if cfg.rollout_workflow == "CodingAgentRolloutWorkflow":
            return await self._agent_group(step, position, weight_version)
        try:
            return await workflow.execute_child_workflow(
                RolloutWorkflow.run,
                RolloutInput(cfg.run_id, step, position, weight_version,
                             heartbeat_seconds=cfg.rollout_heartbeat_seconds),
                id=rollout_workflow_id(cfg.run_id, position),
            )
        except ChildWorkflowError as e:  # permanent failure of one group: leave it out, keep training
            workflow.logger.error("rollout %s failed: %s", position, e.cause)
            return RolloutOutput(position, keep=False, filter_reason=f"failed: {e.cause}", status="failed")

    async def _agent_group(self, step: int, position: int, weight_version: int) -> RolloutOutput:
        """A prompt group of agent rollouts: one CodingAgentRolloutWorkflow per sample. Infra
        failures stay in the group (kept out of advantage statistics by the trainer)."""
        cfg = self.cfg

        async def one(i: int) -> RolloutRef | None:
            try:
                out = await workflow.execute_child_workflow(
                    CodingAgentRolloutWorkflow.run,
                    AgentRolloutInput(cfg.run_id, step, position, i, weight_version,
                                      heartbeat_seconds=cfg.rollout_heartbeat_seconds,
                                      sandbox_task_queue=cfg.sandbox_task_queue),
                    id=agent_workflow_id(cfg.run_id, position, i))
                return out.rollout
            except ChildWorkflowError as e:
                workflow.logger.error("agent rollout %s-%s failed: %s", position, i, e.cause)
                return None

        refs = [r for r in await asyncio.gather(*(one(i) for i in range(cfg.n_samples_per_prompt))) if r]
        rewards = [s.reward for r in refs if not r.infra_failure for s in r.samples[-1:] if s.reward is not None]
        trainable = [r for r in refs if r.samples]
        return RolloutOutput(position, trainable, keep=bool(trainable) and bool(rewards),
                             reward_mean=sum(rewards) / len(rewards) if rewards else None,
                             status="completed" if rewards else "failed")

    # ---- trainer -----------------------------------------------------------------------------

    async def _attach(self) -> TrainerInfo:
        """Pick a live trainer and bring it to `state.checkpoint_step`, then replay to `state.step`."""
        cfg = self.cfg
        self.phase = "attach"
        info = await workflow.execute_activity(
            "pick_trainer", result_type=TrainerInfo, task_queue=cfg.trainer_task_queue,
            schedule_to_close_timeout=timedelta(hours=1), retry_policy=RetryPolicy(maximum_attempts=0))
        at = await workflow.execute_activity(
            "attach_trainer", AttachInput(cfg.run_id, self.state.checkpoint_step, self.state.checkpoint),
            result_type=int, task_queue=info.queue, schedule_to_start_timeout=timedelta(seconds=30),
            heartbeat_timeout=timedelta(seconds=cfg.trainer_heartbeat_seconds), **_short(3600),
            retry_policy=RetryPolicy(maximum_attempts=1))
        self.trainer = info
        for s in range(at, self.state.step):  # steps trained since the checkpoint, on their old rollouts
            await self._train_on(info, s, self.state.replay[str(s)])
        await self._sync_on(info)  # the servers may hold other weights (a lost trainer's, another run's)
        return info

    async def _with_trainer(self, phase: str, call):
        """Run `call(trainer)`; on a lost trainer (timeout: the worker died) re-attach and retry.

        An error the trainer raised is retried on a re-attached trainer a few times, then fails
        the run with the trainer's message: a bug or bad data does not fix itself by looping.
        """
        errors = 0
        while True:
            try:
                info = self.trainer or await self._attach()
                self.phase = phase
                return await call(info)
            except ActivityError as e:
                self.trainer = None
                if not isinstance(e.cause, TimeoutError):
                    errors += 1
                    if errors >= MAX_TRAINER_ERRORS:
                        raise ApplicationError(f"{phase} failed {errors} times: {e.cause}", non_retryable=True) from e
                workflow.logger.warning("%s: trainer lost or failed (%s); re-attaching", phase, e.cause)

    async def _train(self, step: int, refs: list[RolloutRef]) -> dict:
        return await self._with_trainer("train", lambda info: self._train_on(info, step, refs))

    async def _train_on(self, info: TrainerInfo, step: int, refs: list[RolloutRef]) -> dict:
        return await workflow.execute_activity(
            "train_step", TrainInput(self.cfg.run_id, step, refs), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), **_short(4 * 3600),
            heartbeat_timeout=timedelta(seconds=self.cfg.trainer_heartbeat_seconds),
            retry_policy=RetryPolicy(maximum_attempts=1))

    async def _sync(self) -> dict:
        return await self._with_trainer("sync", self._sync_on)

    async def _sync_on(self, info: TrainerInfo) -> dict:
        version = self.state.weight_version + 1
        report = await workflow.execute_activity(
            "sync_weights", SyncInput(self.cfg.engine_urls, version), result_type=dict, task_queue=info.queue,
            schedule_to_start_timeout=timedelta(seconds=30), **_short(1800),
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
        self.state.replay = {}
