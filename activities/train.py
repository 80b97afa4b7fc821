"""Trainer activities: thin wrappers that run `TrainerGroup` commands on rank 0's task queue.

`pick_trainer` is served on the shared trainer queue (any live trainer answers with its own
queue); everything else is served on that worker-specific queue, because the model state lives
in this process. Blocking torch work runs in a thread while the activity heartbeats, so a
killed trainer is noticed within the heartbeat timeout.

The rollout servers' addresses are resolved here, at run time, from this worker's own flags
(`--vllm-server-urls`, which `vime train` sets at every launch), never from the workflow's
input: a resumed run whose servers came back on other ports syncs to where they are now.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import socket
import time
from typing import Any

from temporalio import activity

from activities.errors import final_config_errors
from activities.heartbeat import heartbeating
from vime.engine import live_weights
from vime.engine.health import wait_until_healthy
from vime.engine.weight_sync import WeightSync, verify_sync
from vime.errors import ServiceError
from vime.log import get_logger
from vime.train.group import TrainerGroup
from workflows.training import AttachInput, SaveInput, SyncInput, TrainerInfo, TrainInput

log = get_logger(__name__)

SYNC_WAIT_S = 1800.0  # how long a sync waits for servers that are down (starting, restarting)


def engine_urls(args: Any) -> list[str]:
    """The servers to push weights to: --vllm-server-urls, else the one --vllm-router-ip/port names."""
    if args.vllm_server_urls:
        return list(args.vllm_server_urls)
    if args.vllm_router_ip and args.vllm_router_port:
        return [f"http://{args.vllm_router_ip}:{args.vllm_router_port}"]
    raise ServiceError("the trainer has no vLLM server to sync weights to: pass --vllm-server-urls "
                       "(or --vllm-router-ip/--vllm-router-port naming the one server)")


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
    @final_config_errors
    async def attach_trainer(self, inp: AttachInput) -> int:
        return await self._run("attach", inp.run_id, inp.step, inp.checkpoint)

    @activity.defn(name="train_step")
    @final_config_errors
    async def train_step(self, inp: TrainInput) -> dict:
        return await self._run("train_step", inp.run_id, inp.step)

    @activity.defn(name="sync_weights")
    async def sync_weights(self, inp: SyncInput) -> dict:
        """Push the trainer's weights to every server, then check each with a probe.

        A server that is down (still starting, or being restarted by the launcher) is waited for,
        up to `SYNC_WAIT_S`, with a heartbeat; a sync that fails because a server died under it
        is tried again once the server answers. After a sync every server took, the pushed file
        becomes the run's live weights, which a restarted server boots from.
        """
        urls = list(inp.engine_urls) or engine_urls(self.group.args)
        weights, probe, expected = await self._run("state_dict_and_probe")
        if self._sync is None or self._sync.urls != urls:
            self._sync = WeightSync(urls)
        publish = functools.partial(live_weights.publish, run_dir=self.group.args.run_dir,
                                    base_checkpoint=self.group.args.hf_checkpoint)
        deadline = time.monotonic() + SYNC_WAIT_S
        failed_while_up = 0  # a server that came back needs its transfer engine set up again: one retry
        async with heartbeating():
            while True:
                await self._wait_for(urls, deadline)
                try:
                    report = await self._sync.sync(weights, inp.weight_version, then=publish)
                    worst = max([await verify_sync(url, probe, expected, atol=self.verify_atol) for url in urls])
                    break
                except ServiceError as e:
                    if all([await wait_until_healthy(u, 1.0) for u in urls]):
                        failed_while_up += 1
                    if time.monotonic() > deadline or failed_while_up > 1:
                        raise  # the servers answer, so this is not a restart: report it
                    log.warning("sync.retry", error=str(e)[:300])
        return {**dataclasses.asdict(report), "probe_max_abs_diff": worst}

    async def _wait_for(self, urls: list[str], deadline: float) -> None:
        for url in urls:
            while not await wait_until_healthy(url, 30.0):
                if time.monotonic() > deadline:
                    raise ServiceError(f"weight sync: vLLM server {url} has not answered /health for "
                                       f"{SYNC_WAIT_S / 60:.0f} minutes; start it (or check its log)")
                log.warning("sync.waiting_for_server", url=url)

    @activity.defn(name="save_checkpoint")
    async def save_checkpoint(self, inp: SaveInput) -> str:
        state = {"run_id": inp.run_id, "step": inp.step, "weight_version": inp.weight_version,
                 "data_position": inp.data_position}
        return await self._run("save", inp.root, state)

    def all(self) -> list:
        return [self.attach_trainer, self.train_step, self.sync_weights, self.save_checkpoint]
