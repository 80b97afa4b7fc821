"""Fully async rollouts: a bounded pool of prompt groups always in flight, and steps built from
groups in the order they finish (`--fully-async`, or upstream's
`--rollout-function-path vime.rollout.fully_async_rollout.generate_rollout_fully_async`).

Runs inside the TrainingWorkflow (deterministic: asyncio tasks in a workflow are scheduled from
its history). Each group is a child RolloutWorkflow as in the synchronous mode, so a crash of a
worker, an engine or the launcher loses no group in flight: the child goes on, or is retried.

Staleness (the rules: `workflows.staleness`, pure and tested without Temporal). A group's
staleness is the number of weight versions between the policy it started under (its oldest
token's) and the policy it is trained on. It is bounded by *pacing* (the default,
`--staleness-control pace`): a group starts only while the groups in flight, finished
and waiting, or taken by the step being trained number fewer than `(max_staleness + 1) x
rollout_batch_size`. With `max_staleness=0` that is the synchronous schedule; with 1, the next
step's groups sample while the trainer trains. Finished work is not thrown away to meet the
bound, except a group that was overtaken for longer than the bound (a long tail): it is dropped
and counted (`dropped_groups` in the step's metrics), never trained silently past the bound.
`--staleness-control discard` keeps `--max-concurrent-rollouts` groups in flight whatever their
age and drops (and counts) every group past the bound: more throughput, burnt rollouts.

Weight sync does not wait for the pool: the servers pause with `mode=keep`, and a generation in
flight goes on under the new weights (its weight-version spans say which tokens came from which).

While an eval round holds syncs (`workflows.eval_beside`), the trainer's version runs ahead of
the servers': groups start under the servers' version and are judged against the trainer's, and
none starts that could not be trained (the servers' version is already past the bound).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from vime.temporal.group_contract import RolloutOutput
    from vime.temporal.training_contract import PooledGroup
    from workflows.failures import StepFailures
    from workflows.staleness import PACE, StalenessPolicy


@dataclass
class PoolConfig:
    batch_size: int  # kept groups per step (rollout_batch_size)
    max_in_flight: int  # groups generating at once
    max_staleness: int
    control: str = PACE  # or DISCARD
    max_filtered: int = 1024  # groups filtered in a row before the run stops: the filter keeps nothing
    max_failed_sample_ratio: float = 0.1  # a step's share of samples a hook may fail (workflows.failures)


@dataclass
class TakenStep:
    groups: list[PooledGroup]
    staleness: list[int]  # per group, at the version it is trained on
    dropped: int  # groups dropped past the staleness bound since the previous step
    failures: StepFailures | None = None  # samples drawn and failed by a hook since the previous step


class NothingToTrain(Exception):
    """Every group finished in a long row was filtered out: the filter keeps nothing."""


class TooManyFailed(Exception):
    """A hook failed more of a step's samples than `--max-failed-sample-ratio` allows (the message
    is `StepFailures.stop_message`'s, naming the first error)."""


class RolloutPool:
    """Keeps groups in flight; `take` hands out a step's worth in finish order.

    `start(position, version)` runs one group to its end (a child workflow); `claim()` hands out
    the next data position; `steps_left()` says how many steps after the one being taken still
    need groups, so the pool never starts groups the run will not train; `version()` is the
    policy the servers hold, and `trainer_version()` the one groups are trained on (ahead of it
    while syncs are held).

    The step being taken counts too (`counts_the_step_taken`): a group it loses to the filter
    or to a failed sample is replaced even on the run's last step, whose take would otherwise
    wait forever with nothing in flight. And every group that finishes is counted against the
    next step's failure bound (`workflows.failures`), as the synchronous rounds count the groups
    they draw: a hook failing a few samples costs their groups, one failing most stops the run
    with its first error instead of the filter's message. Both off only to replay histories
    recorded before.
    """

    def __init__(self, cfg: PoolConfig, start: Callable[[int, int], Awaitable[RolloutOutput]],
                 claim: Callable[[], int], steps_left: Callable[[], int], version: Callable[[], int],
                 queued: list[PooledGroup] | None = None, trainer_version: Callable[[], int] | None = None,
                 counts_the_step_taken: bool = True) -> None:
        self.cfg = cfg
        self.policy = StalenessPolicy(cfg.max_staleness, cfg.batch_size, cfg.control)
        self._start, self._claim, self._steps_left, self._version = start, claim, steps_left, version
        self._trainer_version = trainer_version or version
        self.ready: list[PooledGroup] = list(queued or [])
        self.in_flight: dict[int, asyncio.Task] = {}
        self.started_under: dict[int, int] = {}  # in flight: position -> the version it started under
        self.cancelled: set[int] = set()  # positions cancelled on purpose (stale, or the run's end)
        self.taken = 0  # groups of the step being trained, whose weights are not synced yet
        self.dropped = 0
        self.filtered_in_a_row = 0
        self.closing = False
        self.error: BaseException | None = None
        self.counts_the_step_taken = counts_the_step_taken
        self.taking = False  # a step waits in `take` for its groups
        self.failures = StepFailures(cfg.max_failed_sample_ratio)  # groups finished since the last take

    # ---- starting ----------------------------------------------------------------------------

    def live(self) -> int:
        return len(self.in_flight) + len(self.ready) + self.taken

    def fill(self) -> None:
        """Start groups while the pool, the staleness budget and the run's remaining need allow."""
        cfg = self.cfg
        while not self.closing and self.error is None and len(self.in_flight) < cfg.max_in_flight:
            steps = self._steps_left() + (self.taking and self.counts_the_step_taken)
            need = steps * cfg.batch_size - len(self.in_flight) - len(self.ready)
            if need <= 0:
                return
            if not self.policy.may_start(self.live()):
                return
            if not self.policy.admissible(self._version(), self._trainer_version()):
                return  # syncs held too long: a group started now could never be trained
            position, version = self._claim(), self._version()
            self.started_under[position] = version
            self.in_flight[position] = asyncio.create_task(self._run(position, version))

    async def _run(self, position: int, version: int) -> None:
        try:
            out = await self._start(position, version)
        except Exception as e:  # a final error of the group stops the run; one we cancelled does not
            if position not in self.cancelled:
                self.error = self.error or e
            return
        finally:
            self.in_flight.pop(position, None)
            self.started_under.pop(position, None)
        self.failures.add([out])
        if out.keep:
            self.filtered_in_a_row = 0
            self.ready.append(PooledGroup(position, version, out))
            self._drop_stale()
        else:
            self.filtered_in_a_row += 1
        self.fill()

    # ---- taking ------------------------------------------------------------------------------

    def _drop_stale(self) -> None:
        """Drop (and count) the groups past the bound: finished ones, and ones still generating
        (cancelled: they could only be dropped when they finish, and while counted as coming
        they would hold back the groups that replace them). Called when a group finishes and
        when the version moves, the only two events that make a group stale, so `ready` holds
        only admissible groups (and the conditions waited on stay free of side effects)."""
        version = self._trainer_version()
        self.ready, dropped = self.policy.split(self.ready, version)
        self.dropped += len(dropped)
        for position, started_under in list(self.started_under.items()):
            if not self.policy.admissible(started_under, version):
                self.dropped += 1
                self.cancelled.add(position)
                self.started_under.pop(position)
                self.in_flight.pop(position).cancel()

    async def take(self) -> TakenStep:
        """The next step's groups, in the order they finished, once `batch_size` are admissible."""
        size = self.cfg.batch_size
        self.taking = True
        try:
            self.fill()
            await workflow.wait_condition(
                lambda: self.error is not None or len(self.ready) >= size
                or self.filtered_in_a_row >= self.cfg.max_filtered or self._all_failed())
        finally:
            self.taking = False
        if self.error is not None:
            raise self.error
        failures, self.failures = self.failures, StepFailures(self.cfg.max_failed_sample_ratio)
        if self.counts_the_step_taken and failures.over_bound():
            raise TooManyFailed(failures)
        if len(self.ready) < size:
            raise NothingToTrain(f"{self.filtered_in_a_row} groups in a row were filtered out")
        groups, self.ready = self.ready[:size], self.ready[size:]
        self.taken = len(groups)
        dropped, self.dropped = self.dropped, 0
        version = self._trainer_version()
        return TakenStep(groups, [self.policy.staleness(g.weight_version, version) for g in groups], dropped,
                         failures if self.counts_the_step_taken else None)

    def _all_failed(self) -> bool:
        """A batch's worth of groups finished in a row and every sample of them failed: nothing
        will come of drawing more (the synchronous rounds' check after a round)."""
        return (self.counts_the_step_taken and self.filtered_in_a_row >= self.cfg.batch_size
                and self.failures.all_failed())

    def synced(self) -> None:
        """The step's weights are on the servers (or held: the trainer's version moved): its
        groups leave the staleness budget."""
        self.taken = 0
        self._drop_stale()
        self.fill()

    # ---- ending ------------------------------------------------------------------------------

    async def drain(self) -> list[PooledGroup]:
        """Stop starting groups, let those in flight finish; the finished ones, to hand over."""
        self.closing = True
        await workflow.wait_condition(lambda: not self.in_flight)
        if self.error is not None:
            raise self.error
        return list(self.ready)

    async def cancel(self) -> None:
        """The run is over: groups still generating (filter or drop spares) are cancelled."""
        self.closing = True
        self.cancelled.update(self.in_flight)
        tasks = list(self.in_flight.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
