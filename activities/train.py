"""Trainer activities: thin wrappers that run `TrainerGroup` commands on rank 0's task queue.

`pick_trainer` is served on the shared trainer queue (any live trainer answers with its own
queue); everything else is served on that worker-specific queue, because the model state lives
in this process. Blocking torch work runs in a thread while the activity heartbeats, so a
killed trainer is noticed within the heartbeat timeout.
"""

from __future__ import annotations

import asyncio
import dataclasses
import socket

from temporalio import activity

from activities.heartbeat import heartbeating
from vime.engine.weight_sync import WeightSync, verify_sync
from vime.train.group import TrainerGroup
from workflows.training import AttachInput, SaveInput, SyncInput, TrainerInfo, TrainInput


class TrainerActivities:
    def __init__(self, group: TrainerGroup, queue: str, *, verify_atol: float = 1e-3) -> None:
        self.group = group
        self.queue = queue
        self.verify_atol = verify_atol
        self._lock = asyncio.Lock()  # one collective command at a time
        self._sync: WeightSync | None = None

    async def _run(self, name: str, *payload):
        async with self._lock, heartbeating():
            return await asyncio.to_thread(self.group.call, name, *payload)

    @activity.defn(name="pick_trainer")
    async def pick_trainer(self) -> TrainerInfo:
        return TrainerInfo(self.queue, self.group.trainer.step, f"{socket.gethostname()}:{self.queue}")

    @activity.defn(name="attach_trainer")
    async def attach_trainer(self, inp: AttachInput) -> int:
        return await self._run("attach", inp.run_id, inp.step, inp.checkpoint)

    @activity.defn(name="train_step")
    async def train_step(self, inp: TrainInput) -> dict:
        return await self._run("train_step", inp.run_id, inp.step, inp.rollouts)

    @activity.defn(name="sync_weights")
    async def sync_weights(self, inp: SyncInput) -> dict:
        """Push the trainer's weights to every server, then check each with a probe."""
        weights, probe, expected = await self._run("state_dict_and_probe")
        if self._sync is None or self._sync.urls != list(inp.engine_urls):
            self._sync = WeightSync(inp.engine_urls)
        async with heartbeating():
            report = await self._sync.sync(weights, inp.weight_version)
            worst = max([await verify_sync(url, probe, expected, atol=self.verify_atol) for url in inp.engine_urls])
        return {**dataclasses.asdict(report), "probe_max_abs_diff": worst}

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveInput) -> str:
        state = {"run_id": inp.run_id, "step": inp.step, "weight_version": inp.weight_version,
                 "data_position": inp.data_position}
        return await self._run("save", inp.root, state)

    def all(self) -> list:
        return [self.attach_trainer, self.train_step, self.sync_weights, self.save_checkpoint]
