"""Upstream's fully async rollout function, by name and by behaviour.

`vime train --rollout-function-path vime.rollout.fully_async_rollout.generate_rollout_fully_async`
does not call this function: the flag selects vime's durable fully async mode (`--fully-async`,
`workflows/async_pool.py`), where every group in flight is a child workflow that survives any
crash. The function is for code that calls a rollout function itself (a script, a custom
orchestration): as upstream's, a background worker in this process keeps up to
`--max-concurrent-rollouts` (default `--rollout-batch-size`) groups generating, across calls, and
each call returns the next `--rollout-batch-size` groups the dynamic-sampling filter kept, in
the order they finished. Groups in flight when the process dies are lost: that is what the
durable mode adds.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError
from vime.rollout.filters import apply_dynamic_filter
from vime.rollout.group import run_group
from vime.rollout.vllm_rollout import eval_rollout
from vime.types import Sample


@dataclass
class _Worker:
    """Groups generating in the background for one data source, and those finished, in order."""

    args: Any
    data_source: Any
    limit: int
    in_flight: set[asyncio.Task] = field(default_factory=set)
    finished: asyncio.Queue = field(default_factory=asyncio.Queue)

    def fill(self) -> None:
        while len(self.in_flight) < self.limit:
            groups = self.data_source.get_samples(1)
            if not groups:
                return
            task = asyncio.ensure_future(run_group(self.args, groups[0]))
            self.in_flight.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        if not task.cancelled():
            self.finished.put_nowait(task)
        self.fill()


_WORKERS: dict[int, _Worker] = {}


async def generate_rollout_fully_async(args: Any, rollout_id: int, data_source: Any,
                                       evaluation: bool = False) -> list[list[Sample]]:
    """The next `--rollout-batch-size` kept groups, in finish order, from the background worker."""
    if evaluation:
        return await eval_rollout(args, rollout_id)
    target = args.rollout_batch_size
    if not target:
        raise ConfigError("--rollout-batch-size is not set; it is the number of prompt groups per rollout step")
    worker = _WORKERS.get(id(data_source))
    if worker is None or worker.data_source is not data_source:
        limit = args.max_concurrent_rollouts or target
        worker = _WORKERS[id(data_source)] = _Worker(args, data_source, limit)
    worker.fill()
    kept: list[list[Sample]] = []
    while len(kept) < target:
        if worker.finished.empty() and not worker.in_flight:
            raise ConfigError(f"rollout {rollout_id}: the data source ran dry with {len(kept)} of {target} groups")
        rollouts = (await worker.finished.get()).result()  # a group's error reaches the caller
        if apply_dynamic_filter(args, rollouts)[0]:
            kept.append([s for siblings in rollouts for s in siblings])
    return kept


async def stop_background_rollouts() -> None:
    """Cancel every group still generating (end of a script)."""
    workers = list(_WORKERS.values())
    _WORKERS.clear()
    for worker in workers:
        worker.limit = 0  # a cancelled group's callback starts no other
    tasks = [t for w in workers for t in w.in_flight]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
