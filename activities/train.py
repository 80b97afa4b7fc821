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
from collections.abc import Callable
from typing import Any

from structlog.contextvars import bound_contextvars
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from vime.aio import to_thread_to_end
from vime.temporal.retry import final_config_errors
from vime.temporal.heartbeat import heartbeating
from vime.temporal.store_calls import store_call
from vime.engine.weight_sync import live_weights, lora_serving
from vime.engine.health import wait_until_healthy
from vime.engine.weight_sync.sync import WeightSync
from vime.engine.weight_sync.checkpoint_load import engine_urls
from vime.engine.weight_sync.verify import verify_sync
from vime.errors import ServiceError
from vime.log import get_logger
from vime.train.trainer_group import NotAttached, TrainerGroup
from workflows.trainer_calls import (ATTACH_TRAINER, PICK_TRAINER, RELEASE_TRAINER, SAVE_CHECKPOINT, SYNC_WEIGHTS,
                                     SUPERSEDED, TRAIN_STEP, TRAINER_BUSY, WORKER_LOST, AttachInput, PickInput, SaveInput, SyncInput,
                                     TrainerInfo, TrainInput)

log = get_logger(__name__)

STEP_LOG_KEYS = ("reward_mean", "grad_norm", "samples", "train_seconds", "train_tokens_per_second")
LEASE_S = 900.0  # a run that has not called its trainer for this long (terminated) loses it
SYNC_WAIT_S = 1800.0  # how long a sync waits for servers that are down (starting, restarting)


def weight_sync_for(args: Any, urls: list[str]) -> WeightSync:
    """The run's weight sync to `urls`: --weight-sync-engine, --update-weight-mode and, for the
    collective engine, --update-weight-buffer-size bytes per broadcast bucket."""
    return WeightSync(urls, engine=args.weight_sync_engine, update_mode=args.update_weight_mode,
                      bucket_bytes=args.update_weight_buffer_size)


class CallOrder:
    """Which trainer call of each run is its newest, so that one the workflow gave up on does nothing.

    A run's workflow waits for each trainer call before it makes the next, unless it gave up on
    it (a timeout, a `trainer_lost` signal): then a newer call of the run comes while the old one
    runs on here until Temporal's cancel reaches it, at its next heartbeat (seconds later, or
    never when it is the one that waits). Found in CI (the chaos test, twice): after a relaunch, a
    sync that waited for the starting vLLM server was given up on; the workflow re-attached and
    synced versions 2 and 3, then the old sync got its server and pushed its weights as version 2,
    and a server restarted next booted them. So each call is numbered when it starts (`admit`),
    and checks, before anything the servers or the trainer keep, that no newer call of its run came.
    """

    def __init__(self) -> None:
        self._newest: dict[str, int] = {}  # run id -> the number of its newest call

    def admit(self, run_id: str | None) -> Callable[[], None]:
        """Number a call of `run_id` as its newest; the check returned raises `SUPERSEDED` once a newer one came."""
        key = run_id or ""
        number = self._newest[key] = self._newest.get(key, 0) + 1

        def check() -> None:
            if self._newest[key] != number:
                raise ApplicationError(
                    f"run {run_id!r}: a newer trainer call came, so this one was given up on (a timeout, a lost "
                    "trainer); it stops before changing anything", type=SUPERSEDED, non_retryable=True,
                    category=ApplicationErrorCategory.BENIGN)
        return check


class TrainerActivities:
    """The trainer's activities; a long-lived trainer is leased to one run at a time, or to up to
    `max_runs` LoRA runs of one base model at once (`vime.train.tenants`).

    `pick_trainer` leases this trainer to the asking run unless runs it cannot sit beside hold it:
    that run's pick fails with `TrainerBusy` and Temporal retries it (the pending activity shows why
    in the Web UI and `temporal workflow describe`) until a holder releases the trainer at its end,
    or stops calling it for `LEASE_S` (a run terminated without releasing it).

    Runs held together take turns: one command (a step, a sync, a save) runs at a time, and the
    commands wait for it first come, first served. A run has at most one command in flight (its
    workflow waits for each), so with N runs a command waits for at most N - 1 others: no run starves.
    """

    def __init__(self, group: TrainerGroup, queue: str, *, verify_atol: float | None = None,
                 max_runs: int = 1) -> None:
        self.group = group
        self.queue = queue
        self.max_runs = max(1, int(max_runs))
        self._verify_atol = verify_atol
        self._lock = asyncio.Lock()  # one collective command at a time, FIFO
        self._sync: WeightSync | None = None
        self._adapter_syncs: dict[str, Any] = {}  # each LoRA run's AdapterSync (vime.engine.weight_sync.adapter)
        self._leases: dict[str, float] = {}  # run id -> time.monotonic() its lease expires
        self._calls = CallOrder()

    @classmethod
    def serving(cls, group: TrainerGroup, queue: str) -> TrainerActivities:
        """The worker's activities: a long-lived trainer holds up to `--max-runs-per-trainer` runs."""
        return cls(group, queue, max_runs=group.args.max_runs_per_trainer if group.shared else 1)

    def verify_tolerance(self, run_id: str | None = None) -> tuple[float, float]:
        """`(atol, rtol)` for `verify_sync`: 1e-3 with fp32 on both sides; with a bf16 trainer or
        bf16 rollout servers (`vime.config.precision`) 5e-2 + 1% of each |logprob|: a token the trained
        policy gives logprob -23 is 0.05 off with the right weights (the bf16 quickstart)."""
        if self._verify_atol is not None:
            return self._verify_atol, 0.0
        trainer = self.group.tenant(run_id).trainer
        if trainer.dtype.itemsize == 4 and not self.group.args_of(run_id).low_precision_rollouts:
            return 1e-3, 0.0
        return 5e-2, 1e-2

    async def _run(self, name: str, *payload, check: Callable[[], None] | None = None):
        """Run the group command `name` in a thread, one command at a time.

        A cancelled activity (its heartbeat timed out, the workflow gave up on it) cannot stop
        the thread: the lock is held until the thread ends (`vime.aio`), or the workflow's next
        command (a re-attach, a newer sync) would run beside it on the same weights. `check`
        (`CallOrder.admit`) refuses a command whose workflow gave up on it while it waited.
        """
        async with heartbeating(), self._lock:  # waiting for other runs' commands, heartbeating
            if check is not None:
                check()  # given up on while it waited: another command of the run came since
            try:
                return await to_thread_to_end(self.group.call, name, *payload)
            except NotAttached as e:  # taken over by another run: the workflow attaches again
                raise ApplicationError(str(e), type=WORKER_LOST) from None

    def holders(self) -> list[str]:
        """The runs whose leases are live, oldest lease first."""
        now = time.monotonic()
        return [r for r, until in self._leases.items() if until > now]

    def _hold(self, run_id: str) -> None:
        """Lease the trainer to `run_id` (or renew its lease); `TrainerBusy` if runs it cannot sit
        beside hold it, or `max_runs` runs do."""
        others = [r for r in self.holders() if r != run_id]
        if others and not (len(others) < self.max_runs and self.group.can_share([*others, run_id])):
            why = (f"is training run {others[0]!r}" if len(others) == 1 else
                   f"is training runs {', '.join(map(repr, others))}")
            raise ApplicationError(
                f"trainer {socket.gethostname()}:{self.queue} {why}; run {run_id!r} waits for a free trainer "
                "(start another trainer worker to run both at once; LoRA runs of one base model share a "
                "long-lived trainer)", type=TRAINER_BUSY,
                category=ApplicationErrorCategory.BENIGN)  # expected: not a warning with a traceback per retry
        self._leases.pop(run_id, None)
        self._leases[run_id] = time.monotonic() + LEASE_S

    @activity.defn(name=PICK_TRAINER)
    async def pick_trainer(self, inp: PickInput | None = None) -> TrainerInfo:
        if inp is not None:  # a workflow recorded before leases picks without saying who it is
            self._calls.admit(inp.run_id)  # the workflow gave up on any call of the run still running
            self._hold(inp.run_id)
        step = self.group.step_of(inp.run_id) if inp is not None else 0
        return TrainerInfo(self.queue, step, f"{socket.gethostname()}:{self.queue}")

    @activity.defn(name=RELEASE_TRAINER)
    async def release_trainer(self, run_id: str) -> None:
        """The run ended: its lease (and, for a LoRA tenant, its adapter) is freed for the next run."""
        self._calls.admit(run_id)
        if self._leases.pop(run_id, None) is not None and run_id in self.group.tenants:
            await self._run("release", run_id)
        sync = self._adapter_syncs.pop(run_id, None)
        if sync is not None:
            await sync.__aexit__(None, None, None)

    @activity.defn(name=ATTACH_TRAINER)
    @final_config_errors
    async def attach_trainer(self, inp: AttachInput) -> int:
        check = self._calls.admit(inp.run_id)
        self._hold(inp.run_id)
        step = await self._run("attach", inp.run_id, inp.step, inp.checkpoint, inp.current, check=check)
        log.info("trainer.attached", run_id=inp.run_id, step=step, held=sorted(self.group.tenants))
        return step

    @activity.defn(name=TRAIN_STEP)
    @final_config_errors
    async def train_step(self, inp: TrainInput) -> dict:
        """Train one step; its line in the worker's log names the run (a trainer serves many)."""
        check = self._calls.admit(inp.run_id)
        self._hold(inp.run_id)
        with bound_contextvars(run_id=inp.run_id):
            metrics = await self._run("train_step", inp.run_id, inp.step, check=check)
            log.info("train_step.done", step=inp.step, **{k: metrics[k] for k in STEP_LOG_KEYS if k in metrics})
        return metrics

    @activity.defn(name=SYNC_WEIGHTS)
    async def sync_weights(self, inp: SyncInput) -> dict:
        """Push the trainer's weights to every server, then check each with a probe.

        A server that is down (still starting, or being restarted by the launcher) is waited for,
        up to `SYNC_WAIT_S`, with a heartbeat; a sync that fails because a server died under it
        is tried again once the server answers. After a sync every server took, the pushed file
        becomes the run's live weights, which a restarted server boots from.
        """
        run_id = inp.run_id or next(iter(self.group.tenants), None)  # an old workflow's input names none
        with bound_contextvars(run_id=run_id):  # in every line
            return await self._sync_weights(dataclasses.replace(inp, run_id=run_id), self._calls.admit(run_id))

    async def _sync_weights(self, inp: SyncInput, check: Callable[[], None]) -> dict:
        args = self.group.args_of(inp.run_id)
        urls = list(inp.engine_urls) or engine_urls(args)
        if lora_serving.adapter_sync(args):
            return await self._sync_adapter(inp, urls, check)
        weights, probe, expected = await self._run("state_dict_and_probe", inp.run_id, check=check)
        if self._sync is None or self._sync.urls != urls:
            self._sync = weight_sync_for(args, urls)
        publish = functools.partial(live_weights.publish, run_dir=args.run_dir, base_checkpoint=args.hf_checkpoint)

        async def push():
            report = await self._sync.sync(weights, inp.weight_version, then=publish, check=check)
            return report, None
        report, worst = await self._retry_sync(urls, push, probe, expected, inp.run_id)
        return {**dataclasses.asdict(report), "probe_max_abs_diff": worst}

    async def _sync_adapter(self, inp: SyncInput, urls: list[str], check: Callable[[], None]) -> dict:
        """A LoRA run: only the adapter moves (`AdapterSync`), loaded on every server as
        `<run>-v<version>`, which the run's rollouts of that version request; the probe is checked
        against that name. The versions a group may still sample under (`--max-staleness` + 1) stay
        loaded; they are the live adapters a restarted server boots with."""
        from vime.engine.weight_sync.adapter import AdapterSync

        run = inp.run_id or "run"
        args = self.group.args_of(inp.run_id)
        adapter, config, probe, expected, full_bytes = await self._run("adapter_and_probe", inp.run_id, check=check)
        sync = self._adapter_syncs.get(run)
        if sync is None or sync.urls != urls:
            if sync is not None:
                await sync.__aexit__(None, None, None)
            keep = int(args.max_staleness or 0) + 1
            sync = self._adapter_syncs[run] = await AdapterSync(
                urls, run, lora_serving.adapters_dir(args.run_dir, run), keep=keep).__aenter__()

        async def push():
            check()
            report = await sync.sync(adapter, config, inp.weight_version)
            return report, report.name
        report, worst = await self._retry_sync(urls, push, probe, expected, inp.run_id)
        check()
        lora_serving.publish(args.run_dir, inp.weight_version, sync.adapters())
        log.info("sync.adapter", name=report.name, bytes=report.bytes, full_bytes=full_bytes,
                 seconds=round(report.seconds, 4), probe_max_abs_diff=worst)
        return {**dataclasses.asdict(report), "wire_bytes": report.bytes, "full_bytes": full_bytes,
                "adapter": report.name, "probe_max_abs_diff": worst}

    async def _retry_sync(self, urls: list[str], push, probe: list[int], expected: list[float], run_id: str | None):
        """Run `push()` (a sync; it returns its report and the served name to probe, None for the
        base) and check every server's probe logprobs, until both succeed. A server down is waited
        for (up to SYNC_WAIT_S); a failure while every server answers is retried once (a server that
        came back needs its transfer engine set up again), then raised. Returns (report, worst)."""
        deadline = time.monotonic() + SYNC_WAIT_S
        failed_while_up = 0
        async with heartbeating():
            while True:
                await self._wait_for(urls, deadline)
                try:
                    report, name = await push()
                    atol, rtol = self.verify_tolerance(run_id)
                    worst = max([await verify_sync(url, probe, expected, atol=atol, rtol=rtol, model=name)
                                 for url in urls])
                    return report, worst
                except ServiceError as e:
                    if all([await wait_until_healthy(u, 1.0) for u in urls]):
                        failed_while_up += 1
                    if time.monotonic() > deadline or failed_while_up > 1:
                        raise  # the servers answer, so this is not a restart: report it
                    log.warning("sync.retry", error=str(e)[:300])

    async def _wait_for(self, urls: list[str], deadline: float) -> None:
        for url in urls:
            while not await wait_until_healthy(url, 30.0):
                if time.monotonic() > deadline:
                    raise ServiceError(f"weight sync: vLLM server {url} has not answered /health for "
                                       f"{SYNC_WAIT_S / 60:.0f} minutes; start it (or check its log)")
                log.warning("sync.waiting_for_server", url=url)

    @activity.defn(name=SAVE_CHECKPOINT)
    async def save_checkpoint(self, inp: SaveInput) -> str:
        """Save the checkpoint and record it in the store: a later start of the run from an older
        state (the Web UI's form with the run's `vime config` JSON) resumes from it
        (`workflows/durable_start.py`)."""
        state = {"run_id": inp.run_id, "step": inp.step, "weight_version": inp.weight_version,
                 "data_position": inp.data_position}
        path = await self._run("save", inp.root, state, check=self._calls.admit(inp.run_id))
        if path:
            await store_call(self.group.store.record_checkpoint, inp.run_id, inp.step, path,
                             weight_version=inp.weight_version, data_position=inp.data_position)
        return path

    def all(self) -> list:
        return [self.attach_trainer, self.train_step, self.sync_weights, self.save_checkpoint, self.release_trainer]
