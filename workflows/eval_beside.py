"""Fully async mode: an eval round runs beside the step loop, and the trainer goes on meanwhile.

A round started at the boundary before step k samples the policy version the servers hold then
(`weight_version`); every eval sample must carry exactly that version (checked per sample by the
round's activities). So while the round samples, weight syncs are *held*: a step trained then
moves the trainer's version on (`TrainingState.held_syncs`, `trainer_version`) but not the
servers'; when the round's generation ends, the next sync pushes the latest weights as the
trainer's version (versions still count every step trained).

The trainer keeps training as long as the pool's groups can stay within `--max-staleness` of
its version: groups start under the servers' version, so once `held_syncs` passes the bound
nothing the servers sample could be trained, and the step loop waits for the round's generation
to end and pushes the held sync (`before_take`). A checkpoint, continue-as-new, the next round
and the run's end also wait for the round (`settle`): a checkpoint holds the weights of its
version, and nothing about a round travels in the workflow's input.

A step's metrics line waits for the round begun at its boundary, so the round's figures land on
that step's line as in synchronous mode and lines stay in step order (`record`).

Synchronous mode keeps the blocking round (`EvalRounds.run` awaited by the loop): there the next
step's groups need the step's sync before they may sample (on-policy, or `--max-staleness`
prefetch that already runs meanwhile), so holding syncs would stop the rollouts instead of
letting the trainer on.

Durable as the rest of the workflow: the round is a task of the workflow, scheduled from its
history, so a replay (a worker killed, the history replayed elsewhere) rebuilds the hold; a
trainer re-attached meanwhile pushes the round's version again, not its own
(`TrainerSession._attach`). Histories from before this module replay the blocking round
(`ASYNC_EVAL_PATCH`). Workflow code: deterministic, light imports only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from vime.temporal.training_contract import TrainingConfig, TrainingState
    from workflows.eval_round import EvalRounds
    from workflows.step_collection import StepCollection
    from workflows.trainer_session import TrainerSession

ASYNC_EVAL_PATCH = "eval-beside-training"  # fully async histories recorded before replay the blocking round


class EvalBeside:
    """The round in flight beside the step loop, its held syncs, and the step lines waiting for it."""

    def __init__(self, evals: EvalRounds, trainer: TrainerSession, rollouts: StepCollection,
                 record: Callable[[int, dict], Awaitable[None]]) -> None:
        self.evals, self.trainer, self.rollouts, self._record = evals, trainer, rollouts, record
        self.cfg: TrainingConfig | None = None
        self.state = TrainingState()
        self.round: asyncio.Task[dict[str, Any]] | None = None
        self.round_step = -1
        self.lines: list[tuple[int, dict]] = []  # step lines waiting for the round

    def begin(self, cfg: TrainingConfig, state: TrainingState) -> None:
        self.cfg, self.state = cfg, state

    def applies(self) -> bool:
        """Rounds run beside training in this run (fully async, and not a history from before)."""
        return self.cfg.fully_async and workflow.patched(ASYNC_EVAL_PATCH)

    async def start(self, step: int) -> None:
        """Start the round at the boundary before `step` (call when due): the previous round is
        settled first, so this one samples the latest weights."""
        await self.settle()
        self.round_step = step
        self.evals.sampling = True  # before any sync can run: held from now on
        self.round = asyncio.create_task(self._run(step))

    async def _run(self, step: int) -> dict[str, Any]:
        figures = await self.evals.run(step)
        return {**figures, "eval_finished_at": workflow.now().timestamp()}

    def _watch(self) -> None:
        """A round that failed fails the run (at the next step boundary at the latest)."""
        if self.round is not None and self.round.done() and not self.round.cancelled():
            if (error := self.round.exception()) is not None:
                raise error

    async def sync(self) -> dict:
        """The step's sync, or its hold while the round samples."""
        self._watch()
        if self.evals.sampling:
            self.trainer.hold()
            return {"held": True}
        return await self.trainer.sync()

    async def before_take(self) -> None:
        """Before a step takes groups: once the servers' version is past the bound, nothing they
        sample could be trained, so wait for the round's generation and push the held weights."""
        self._watch()
        if self.state.held_syncs > self.cfg.max_staleness:
            await self.unhold()

    async def unhold(self) -> None:
        """No sync held: wait for the round's generation to end, then push the latest weights."""
        if self.state.held_syncs:
            await workflow.wait_condition(lambda: not self.evals.sampling)
            await self.trainer.push_held()
            self.rollouts.refill()

    async def record(self, step: int, metrics: dict) -> None:
        """The step's line: now, or once the round begun before it is recorded."""
        if self.round is None:
            await self._record(step, metrics)
            return
        self.lines.append((step, metrics))
        await self._flush()

    async def settle(self) -> None:
        """Wait for the round in flight: its generation, the held sync, its figures, the lines
        waiting for them."""
        await self.unhold()
        if self.round is not None:
            await workflow.wait_condition(self.round.done)
            await self._flush()

    async def cancel(self) -> None:
        if self.round is not None and not self.round.done():
            self.round.cancel()
            await workflow.wait_condition(self.round.done)

    async def _flush(self) -> None:
        """Once the round is recorded: the lines that waited, its figures on the line of its step."""
        if self.round is None or not self.round.done():
            return
        figures = self.round.result()  # raises the round's failure
        lines, self.lines, self.round = self.lines, [], None
        for step, metrics in lines:
            if step == self.round_step:
                metrics.update(figures)
            await self._record(step, metrics)
