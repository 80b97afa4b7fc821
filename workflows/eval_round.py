"""Eval rounds inside the TrainingWorkflow: each `--eval-prompt-data` set evaluated through the
run's environment with evaluation on, at step 0 (the baseline, unless `--skip-eval-before-train`),
every `--eval-interval` steps and after the last step.

One policy version per round: a round runs at a step boundary, after the sync of the previous
step's weights and before the next step trains, and the step loop waits for it; nothing syncs
weights while it runs, so every eval sample of the round at step k is sampled by policy version
`weight_version` (k in a synchronous run), recorded on each sample and checked by the group's
activity (a sample from other weights, a server restarted and not synced yet, is sampled again).
Training rollouts collected ahead (`--max-staleness`) or the fully async pool go on meanwhile.
In fully async mode the trainer goes on too: the round runs beside the step loop and holds the
weight syncs while it samples (`workflows.eval_beside`; `sampling` says when).

Durable as any rollout: one child group workflow per eval prompt, with the deterministic id
`eval_workflow_id(run, step, set, prompt)`, whose activity finds its rollouts stored on a retry
(ids `vime.rollout.eval_data.eval_rollout_id`), so no eval prompt is sampled or graded twice; the
round's figures are recorded once in the store (`record_eval`, first write wins), and a round
found recorded (a run restarted under its id) is reported, not run again. With
`--eval-function-path` (or a custom `--rollout-function-path`), slime's hook evaluates the round
in one heartbeating activity that stores what it returns, once.

Workflow code: deterministic, light imports only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ChildWorkflowError, is_cancelled_exception

with workflow.unsafe.imports_passed_through():
    from vime.envs.group_workflow import starting_search_attributes
    from vime.temporal.error_types import final_error, root_message
    from vime.temporal.group_contract import GroupInput, GroupOutput
    from vime.temporal.activity_bounds import rollout_activity_options, rollout_heartbeat_seconds
    from vime.temporal.search_attributes import EVAL
    from vime.temporal.training_contract import TrainingConfig, TrainingState

EVAL_PLAN = "eval_plan"
RECORD_EVAL = "record_eval"
EVAL_BY_FUNCTION = "evaluate_by_function"
EVAL_PATCH = "eval-rounds"  # histories recorded before eval rounds replay without them
EVAL_ATTRIBUTE_PATCH = "eval-search-attribute"  # ... and before eval groups carried VimeEval
EVAL_CONCURRENCY = 64  # eval groups in flight at once: a 10,000-prompt set is not 10,000 children at once


@dataclass
class EvalRoundInput:
    run_id: str
    step: int
    weight_version: int = 0
    heartbeat_seconds: float = 60.0
    seconds: float = 0.0  # record_eval: the round's wall time, recorded with its figures


@dataclass
class EvalSet:
    name: str
    prompts: int
    samples_per_prompt: int = 0  # the set's own (--eval-config); 0: --n-samples-per-eval-prompt


@dataclass
class EvalPlan:
    """What a round evaluates, and the round's figures if it is recorded already."""

    sets: list[EvalSet] = field(default_factory=list)
    recorded: dict[str, Any] | None = None


def eval_search_attributes(inp: GroupInput) -> TypedSearchAttributes:
    """A group's search attributes (run, prompt, policy version, status) and `VimeEval=true`:
    `temporal workflow list --query "VimeRunId='X' AND VimeEval=true"` lists a run's eval
    groups. Histories recorded before it replay without it (the patch)."""
    started = starting_search_attributes(inp)
    if not workflow.patched(EVAL_ATTRIBUTE_PATCH):
        return started
    return TypedSearchAttributes([*started.search_attributes, EVAL.value_set(True)])


def eval_workflow_id(run_id: str, step: int, eval_set: str, position: int) -> str:
    return f"{run_id}-eval{step}-{eval_set}-{position}"


def eval_due(cfg: TrainingConfig, step: int) -> bool:
    """Whether a round runs at the boundary before training step `step` (`step == num_rollout`:
    after the last step)."""
    every = cfg.eval_interval
    if not every:
        return False
    if step == 0:
        return not cfg.skip_eval_before_train
    return step % every == 0 or step == cfg.num_rollout


def flat(metrics: dict[str, Any]) -> dict[str, Any]:
    """A recorded round's figures as a step's metrics carry them: `eval/<set>/<figure>`,
    `eval_seconds` and `eval_weight_version` (the policy the round sampled)."""
    return {k: v for k, v in metrics.items() if k.startswith("eval")}


class EvalRounds:
    """The run's eval rounds; `running` counts eval group workflows in flight (a cancelled run
    waits for them to end); `sampling` is true from a round's start until its generation ends
    (the servers must keep its policy version until then)."""

    def __init__(self) -> None:
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.running = 0
        self.sampling = False

    def begin(self, cfg: TrainingConfig, state: TrainingState) -> None:
        self.cfg, self.state = cfg, state

    def due(self, step: int) -> bool:
        return eval_due(self.cfg, step) and workflow.patched(EVAL_PATCH)

    async def run(self, step: int, before: Callable[[], Awaitable[None]] | None = None) -> dict[str, Any]:
        """The round at `step` (call only when `due`): its figures, `eval/<set>/<figure>`.
        `before()` runs once the round is known not to be recorded yet, before it samples (`vime
        eval` loads the checkpoint's weights there)."""
        self.sampling = True
        try:
            return await self._run(step, before)
        finally:
            self.sampling = False

    async def _run(self, step: int, before: Callable[[], Awaitable[None]] | None) -> dict[str, Any]:
        cfg = self.cfg
        version = self.state.weight_version
        inp = EvalRoundInput(cfg.run_id, step, version, cfg.rollout_heartbeat_seconds)
        plan = await workflow.execute_activity(
            EVAL_PLAN, inp, result_type=EvalPlan, task_queue=cfg.rollout_task_queue,
            **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(seconds=300)))
        if plan.recorded is not None:
            return flat(plan.recorded)
        if before is not None:
            await before()
        t0 = workflow.time()
        if cfg.eval_by_function:
            await workflow.execute_activity(
                EVAL_BY_FUNCTION, inp, task_queue=cfg.rollout_task_queue,
                **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(hours=12), capped=False))
        else:
            slots = asyncio.Semaphore(EVAL_CONCURRENCY)
            await asyncio.gather(*(self._group(slots, step, version, s, i)
                                   for s in plan.sets for i in range(s.prompts)))
        self.sampling = False
        inp.seconds = workflow.time() - t0
        recorded = await workflow.execute_activity(
            RECORD_EVAL, inp, result_type=dict, task_queue=cfg.rollout_task_queue,
            **rollout_activity_options(cfg.rollout_heartbeat_seconds, timedelta(seconds=600)))
        return flat(recorded)

    async def _group(self, slots: asyncio.Semaphore, step: int, version: int, dataset: EvalSet,
                     position: int) -> GroupOutput:
        """One eval prompt's group from the run's environment, with evaluation on."""
        cfg = self.cfg
        eval_set, n = dataset.name, dataset.samples_per_prompt or cfg.n_samples_per_eval_prompt
        async with slots:
            self.running += 1
            try:
                inp = GroupInput(cfg.run_id, step, position, version, evaluation=True, eval_set=eval_set,
                                 heartbeat_seconds=rollout_heartbeat_seconds(cfg.rollout_heartbeat_seconds),
                                 local_activity=cfg.local_activities,
                                 n_samples_per_prompt=n,
                                 sandbox_task_queue=cfg.sandbox_task_queue)
                out = await workflow.execute_child_workflow(
                    cfg.rollout_workflow, inp, id=eval_workflow_id(cfg.run_id, step, eval_set, position),
                    result_type=GroupOutput, search_attributes=eval_search_attributes(inp))
                check_eval_ids(out, cfg.rollout_workflow, step, eval_set)
                return out
            except ChildWorkflowError as e:
                if is_cancelled_exception(e):
                    raise
                raise final_error(f"eval group {position} of set {eval_set!r} (round at step {step}) failed: "
                                  f"{root_message(e)}") from e
            finally:
                self.running -= 1


def check_eval_ids(out: GroupOutput, group_workflow: str, step: int, eval_set: str) -> None:
    """An environment's eval group came back under the round's eval rollout ids: one that ignored
    `GroupInput.evaluation` (read a training prompt, stored under a training id) would mix eval
    samples into training, so the run stops with the fix in one line."""
    prefix = f"eval{step}-{eval_set}-"
    wrong = [rid for rid in out.rollout_ids if not rid.startswith(prefix)]
    if wrong:
        raise final_error(f"eval group {out.position} of set {eval_set!r} (round at step {step}): {group_workflow} "
                          f"stored rollout id(s) {', '.join(wrong[:3])}, not the round's eval ids ({prefix}<index>): "
                          "the environment ignores GroupInput.evaluation; read prompts with "
                          "vime.envs.prompt_group(args, inp) and store with vime.envs.store_group/store_rollout")
