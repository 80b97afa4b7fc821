"""Activities of CodingAgentRolloutWorkflow besides the sandbox's: resolve the task and store
the rollout's samples (rollout queue), run the agent session (the sandbox host's queue: the
session runs its tools in the sandbox, which for a local backend exists on the booting host
only; see vime/envs/coding_agent/sandbox_activities.py).

The session is the long one. It heartbeats (in the background and after every step), and after
every agent step it stores a checkpoint (`TrajectoryRecorder`: the step's tokens, the agent's
state, the workspace diff). A retried session — its worker was killed, the engine dropped a
connection — loads the checkpoints, puts the sandbox back to the stored diff, reopens the
adapter sessions with their segments and continues the agent after its last stored step.

Storing is separate and idempotent: it rebuilds the segments from the stored steps, fans them
out (`vime.agent.fanout`) with the graded reward and writes the rollout once.

Every store call runs in a thread (`store_call`): a write waiting for SQLite's lock must not stop
the worker's event loop, which sends this and every other activity's heartbeats.
"""

from __future__ import annotations

from pathlib import Path

from temporalio import activity

from vime.temporal.heartbeat import heartbeating
from vime.envs.coding_agent.sandbox_activities import attach
from vime.temporal.store_calls import store_call
from vime.envs.base import EnvContext, EnvWorkers
from vime.envs.contract import SampleInput, sample_previews
from vime.envs.rollouts import check_policy, group_args, prompt_file, prompt_group, sampled_here, store_rollout
from vime.envs.coding_agent.config import shared_adapter
from vime.envs.coding_agent.task import coding_task
from vime.agent.fanout import trajectory_to_samples
from vime.agent.recorder import TrajectoryRecorder
from vime.sandbox.git import capture_diff, restore_diff
from vime.errors import ConfigError
from vime.log import get_logger
from vime.temporal.build_id import code_build_id
from vime.rollout.tokenization import get_tokenizer
from vime.types import RolloutRef, Sample
from vime.envs.coding_agent.workflow import (AgentRolloutInput, AgentRolloutOutput, AgentTask, SessionInput,
                                    SessionOutput, StoreInput)

log = get_logger(__name__)


def task_from_sample(sample: Sample, data_dir: Path) -> AgentTask:
    task = coding_task(sample, data_dir)
    return AgentTask(sample.rollout_id or str(sample.index), sample.group_index, sample.index, task.prompt,
                     task.repo_dir, task.test_command, task.task_id)


def _failure_class(inp: StoreInput) -> str:
    if inp.infra_failure:
        return inp.outcome or "infra:unknown"
    return f"task:{inp.outcome}" if inp.outcome in ("patch_failed", "timeout") else "none"


def _sampled_by(attempts: list[str], workers: list[str]) -> dict[str, str]:
    """The session attempts that stored the rollout's steps and their workers, each once, in
    order (`sampled_by` "5#1,5#2": attempt 2 resumed the session after a crash)."""
    found = {"sampled_by": ",".join(dict.fromkeys(a for a in attempts if a)),
             "worker": ",".join(dict.fromkeys(w for w in workers if w))}
    return {k: v for k, v in found.items() if v}


class CodingAgentActivities:
    """Each activity works for the run its input names, with that run's config (`ctx.run_args`):
    its data, model, router and `--agent-*` flags. The worker's own flags give only its queues."""

    def __init__(self, ctx: EnvContext) -> None:
        self.ctx = ctx
        self.store = ctx.store

    # ---- the task --------------------------------------------------------------------------

    @activity.defn(name="agent_task")
    async def agent_task(self, inp: AgentRolloutInput) -> AgentTask:
        args = await self.ctx.run_args(inp.run_id)
        group = await prompt_group(args, inp)  # a training prompt's, or an eval prompt's in an eval round
        if not 0 <= inp.index < len(group):
            raise ConfigError(f"sample {inp.index} of prompt group {inp.position}: the group has {len(group)}")
        return task_from_sample(group[inp.index], Path(prompt_file(args, inp) or ".").resolve().parent)

    # ---- the session -----------------------------------------------------------------------

    @activity.defn(name="agent_session")
    async def agent_session(self, inp: SessionInput) -> SessionOutput:
        from vime.envs.coding_agent.session import run_session  # the harnesses import the anthropic SDK

        args = group_args(await self.ctx.run_args(inp.run_id), inp)  # an eval set's own settings (--eval-config)
        sbx = await attach(args, inp.sandbox_id)
        recorder = TrajectoryRecorder(self.store, inp.run_id, inp.task.rollout_id)
        restored = await store_call(recorder.load)
        if restored.next_turn:
            await restore_diff(sbx, restored.diff)
            log.info("agent.session.resume", rollout_id=inp.task.rollout_id, after_turn=restored.next_turn - 1,
                     attempt=activity.info().attempt)
        adapter = await shared_adapter(args)

        async def checkpoint(chains, agent_state: dict) -> None:
            # a step sampled by the wrong weights is not stored: the retried session samples it again
            check_policy([Sample(weight_versions=[v for t in seg.turns for v in t.weight_versions])
                          for segs in chains.values() for seg in segs], inp, f"rollout {inp.task.rollout_id}")
            here = sampled_here()
            turn = await store_call(recorder.save, chains, agent_state, await capture_diff(sbx),
                                    attempt=here.get("sampled_by", ""), worker=here.get("worker", ""))
            activity.heartbeat(turn)

        async with heartbeating():
            info = activity.info()
            return await run_session(args, adapter, sbx, inp.run_id, inp.task, restored, checkpoint,
                                     attempt=f"{info.activity_id}.{info.attempt}", evaluation=inp.evaluation)

    # ---- storing ---------------------------------------------------------------------------

    @activity.defn(name="store_agent_rollout")
    async def store_agent_rollout(self, inp: StoreInput) -> AgentRolloutOutput:
        task, args = inp.task, await self.ctx.run_args(inp.run_id)
        restored = await store_call(TrajectoryRecorder(self.store, inp.run_id, task.rollout_id).load)
        chains = restored.chains
        where = SampleInput(inp.run_id, inp.step, task.group_index, 0, inp.weight_version, evaluation=inp.evaluation,
                            eval_set=inp.eval_set)
        base = next((s for s in await prompt_group(args, where) if s.index == task.index), None)
        if base is None:  # the group's size is the run's --n-samples-per-prompt, as when agent_task resolved it
            raise ConfigError(f"rollout {task.rollout_id}: no sample {task.index} in prompt group {task.group_index}")
        base.metadata = {**(base.metadata or {}), "weight_version": inp.weight_version, "task_id": task.task_id,
                         "diff": inp.diff, "diff_id": inp.diff_id, "grade": {"outcome": inp.outcome, "reason": inp.reason}}
        if inp.infra_failure:
            base.metadata["infra_failure"] = inp.infra_failure
        base.metadata.update(_sampled_by(restored.attempts, restored.workers))
        tokenizer = get_tokenizer(args.hf_checkpoint)
        samples = trajectory_to_samples(chains, rollout_id=task.rollout_id,
                                        reward=None if inp.infra_failure else inp.reward, base=base, tokenizer=tokenizer)
        if inp.infra_failure:
            for s in samples:
                s.status = Sample.Status.FAILED
        refs = await store_rollout(self.store, where, task.rollout_id, samples,
                                   check=not inp.infra_failure) if samples else []
        status = "failed" if inp.infra_failure else "completed"
        ref = RolloutRef(inp.run_id, task.rollout_id, refs, inp.weight_version,
                         inp.infra_failure or (None if samples else "the agent sampled nothing"))
        log.info("agent.rollout.stored", rollout_id=task.rollout_id, samples=len(refs), reward=inp.reward,
                 outcome=inp.outcome, infra_failure=inp.infra_failure)
        return AgentRolloutOutput(ref, None if inp.infra_failure else inp.reward, status, _failure_class(inp),
                                  inp.outcome, inp.diff_id,
                                  preview=sample_previews([task.rollout_id], [samples]) if samples else None)

    def on_rollout_queue(self) -> list:
        return [self.agent_task, self.store_agent_rollout]

    def on_host_queue(self) -> list:
        """The session runs where its sandbox was booted (with `SandboxActivities.on_host_queue`)."""
        return [self.agent_session]


def start(ctx: EnvContext) -> EnvWorkers:
    """The coding agent in a rollout worker: task resolution and storing on the rollout queue;
    boots and grading on the shared sandbox queue; what uses a booted sandbox (the session, its
    diff, its teardown) on this process's own queue, where a local sandbox lives."""
    from temporalio.worker import Worker

    from vime.envs.coding_agent.sandbox_activities import SandboxActivities

    sandboxes = SandboxActivities(ctx.args, ctx.store, run_args=ctx.run_args)
    agents = CodingAgentActivities(ctx)
    workers = [
        Worker(ctx.client, task_queue=ctx.args.sandbox_task_queue, activities=sandboxes.on_sandbox_queue(),
               max_concurrent_activities=64, build_id=code_build_id()),
        Worker(ctx.client, task_queue=sandboxes.host_queue,
               activities=sandboxes.on_host_queue() + agents.on_host_queue(), max_concurrent_activities=256,
               build_id=code_build_id()),
    ]

    async def close() -> None:  # a stopping worker must not leave its sandboxes behind
        await sandboxes.destroy_booted()

    return EnvWorkers(activities=agents.on_rollout_queue(), workers=workers, close=close)
