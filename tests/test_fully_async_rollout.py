"""Upstream's `generate_rollout_fully_async`, called as a plain rollout function (no `vime train`):
a background worker keeps groups generating across calls, and each call returns the next kept
groups in the order they finished. (Under `vime train` the name selects the durable mode:
tests/test_fully_async.py.)"""

from __future__ import annotations

from tests.test_rollout_generate import hook_module, make_args  # noqa: F401 - a fixture
from vime.rollout import fully_async_rollout
from vime.rollout.data_source import RolloutDataSource

SLOW_FIRST = """
import asyncio
from vime.types import Sample

STARTED = []

async def generate(args, sample, sampling_params):
    STARTED.append(sample.group_index)
    await asyncio.sleep(0.2 if sample.group_index % 2 == 0 else 0.02)  # even groups are the long tail
    sample.tokens = [1, 2, 3]
    sample.append_response_tokens([4], [-0.1], text="x")
    sample.status = Sample.Status.COMPLETED
    return sample
"""


async def test_each_call_returns_the_next_groups_to_finish_while_others_keep_generating(tmp_path, hook_module):
    mod = hook_module(SLOW_FIRST)
    args = make_args(tmp_path, "--custom-generate-function-path", f"{mod}.generate", "--rm-type", "exact_match",
                     "--rollout-batch-size", "2", "--n-samples-per-prompt", "2", "--max-concurrent-rollouts", "4")
    source = RolloutDataSource(args)
    try:
        first = await fully_async_rollout.generate_rollout_fully_async(args, 0, source)
        assert [g[0].group_index for g in first] == [1, 3]  # the odd (fast) groups finished first
        worker = fully_async_rollout._WORKERS[id(source)]
        assert len(worker.in_flight) + worker.finished.qsize() == 4  # the pool stays full between calls
        second = await fully_async_rollout.generate_rollout_fully_async(args, 1, source)
        order = [g[0].group_index for g in second]
        assert order[0] == 5 and order[1] in (0, 2)  # a later fast group, then the tail (not regenerated)
        assert all(len(g) == 2 for g in first + second)
    finally:
        await fully_async_rollout.stop_background_rollouts()
    assert not fully_async_rollout._WORKERS
