"""The rollout's phase timers: the samples of a group add to one accumulator, and outside a
profiled activity they record nothing."""

from __future__ import annotations

import asyncio

from vime.rollout.phase_times import collecting, timed
from workflows.rollout import RolloutOutput
from workflows.step_collection import mean_perf


async def _sample(seconds: float) -> None:
    with timed("http"):
        await asyncio.sleep(seconds)


def test_concurrent_samples_of_a_group_add_their_seconds_to_the_groups_phase():
    async def group() -> dict[str, float]:
        with collecting() as times:
            await asyncio.gather(*(_sample(0.05) for _ in range(4)))
        return times

    times = asyncio.run(group())
    assert set(times) == {"http"} and 0.2 <= times["http"] < 0.6  # four samples' seconds, not the wall time


def test_a_timer_outside_a_profiled_activity_records_nothing():
    with collecting() as times:
        pass
    asyncio.run(_sample(0.0))
    assert times == {}


def test_a_steps_profile_is_each_phases_mean_over_the_groups_that_timed_it():
    groups = [RolloutOutput(0, perf={"http": 1.0, "store": 0.2}), RolloutOutput(1, perf={"http": 3.0}),
              RolloutOutput(2)]  # answered from the store: no timers
    assert mean_perf(groups) == {"http": 2.0, "store": 0.2}
    assert mean_perf([RolloutOutput(0)]) == {}
