"""`vime fleet`: a shared fleet that many LoRA runs start on in seconds, until Ctrl-C.

    vime fleet --fleet-dir DIR --hf-checkpoint MODEL [--lora-max-rank 16] [--vllm-<flag> ...]
               [--temporal-address HOST:PORT]

A run's first minute under `vime train` is mostly starting things: vLLM (three processes that each
import torch and vLLM), the Temporal dev server, two workers. A fleet starts them once and keeps
them: one vLLM server of MODEL with LoRA enabled (room for several runs' adapters, two versions
each), a Temporal dev server with its SQLite file in DIR (unless --temporal-address), the store
`sqlite:///DIR/vime.db`, and a long-lived rollout worker and trainer that serve any run from its
stored flags. Every part is supervised as under `vime train` (a killed server comes back on the
same address, the dev server on the same file, a worker restarted) and runs under `vime.procguard`,
so nothing outlives the fleet. Once every part answers, `DIR/fleet.json` says where they are; runs
then start with `vime train --fleet DIR --lora-rank R ...` (`vime.launcher.fleet_launch`).

Only LoRA runs: a run that trained the base weights would change what every other run samples.
One fleet per directory (a lock file, as a run directory has).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

from vime.config.args import check_vllm_flags, parse_args
from vime.config.forward import CHECKED_ENV
from vime.engine.model_fleets import ModelFleets, model_fleets
from vime.engine.topology import topology_of
from vime.engine.weight_sync.lora_serving import MAX_LORAS, VLLM_LORA_RANKS
from vime.errors import ConfigError, ServiceError
from vime.launcher.recovery import recover_from_worker_death
from vime.launcher.fleet_info import FleetInfo, process_started_at, remove_fleet, write_fleet
from vime.launcher.supervisor import Supervisor, WorkerProcess
from vime.procs import ask_all_to_stop
from vime.rundir import RunDirLock, holder
from vime.store import SampleStore
from vime.temporal.client import TemporalService, temporal_service
from vime.temporal.training_contract import TRAINER_LOST_SIGNAL, TRAINING_WORKFLOW

DEFAULT_MAX_RANK = 16
FLEET_RUNS = 4  # runs whose adapters one batch may mix, each with MAX_LORAS versions (around a sync)
WORKERS_READY_S = 300.0


@dataclass(frozen=True)
class FleetOptions:
    fleet_dir: Path
    max_lora_rank: int
    args: object  # VimeArgs: the model, --vllm-*/--router-*, Temporal; run dir and store in fleet_dir


def parse_fleet_args(argv: list[str]) -> FleetOptions:
    parser = argparse.ArgumentParser(prog="vime fleet", allow_abbrev=False, description=__doc__.split("\n\n")[0])
    parser.add_argument("--fleet-dir", required=True, help="the fleet's directory: fleet.json, logs, store, Temporal")
    parser.add_argument("--lora-max-rank", type=int, default=DEFAULT_MAX_RANK, choices=VLLM_LORA_RANKS,
                        help=f"the largest --lora-rank a run may train (default {DEFAULT_MAX_RANK})")
    ns, rest = parser.parse_known_args(argv)
    fleet_dir = Path(ns.fleet_dir).resolve()
    args = parse_args([*rest, "--run-dir", str(fleet_dir), "--run-id", "fleet"], vllm_flags=False)
    if not args.hf_checkpoint or not Path(args.hf_checkpoint).is_dir():
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint!r}: vime fleet serves a local model directory; "
                          "pass one (the base model every run on the fleet trains an adapter of)")
    if (pid := holder(fleet_dir)) is not None:
        raise ConfigError(f"--fleet-dir {fleet_dir}: a fleet already serves it (pid {pid}); start runs on it with "
                          f"`vime train --fleet {fleet_dir} --lora-rank R ...`, or stop it (kill {pid})")
    return FleetOptions(fleet_dir, ns.lora_max_rank, check_vllm_flags(args))


def _server_args(args) -> list[str]:
    """The user's --vllm-* flags, and room for FLEET_RUNS runs' adapters unless they set --max-loras."""
    given = list(args.vllm_server_args)
    if any(a == "--max-loras" or a.startswith("--max-loras=") for a in given):
        return given
    return ["--max-loras", str(FLEET_RUNS * MAX_LORAS), *given]


def _workers(opts: FleetOptions, temporal_address: str) -> list[WorkerProcess]:
    """The long-lived workers: connections only; each run's flags come from the store."""
    a = opts.args
    argv = ["--store-url", a.store_url, "--temporal-address", temporal_address,
            "--temporal-namespace", a.temporal_namespace]
    return [WorkerProcess(name, f"workers.{name}", argv, opts.fleet_dir / f"worker-{name}.log", opts.fleet_dir,
                          env={CHECKED_ENV: "1"}) for name in ("rollout", "trainer")]


async def _polled(client, queue: str, kind: TaskQueueType.ValueType) -> bool:
    answer = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind))
    return bool(answer.pollers)


async def wait_for_workers(svc: TemporalService, args, supervisor: Supervisor) -> None:
    """Until the rollout worker polls its queue and the trainer announces itself on its own."""
    queues = [(args.rollout_task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
              (args.trainer_task_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)]
    deadline = time.monotonic() + WORKERS_READY_S
    while not all([await _polled(svc.client, q, kind) for q, kind in queues]):
        _report_deaths(supervisor)
        if time.monotonic() > deadline:
            raise ServiceError(f"the fleet's workers did not poll Temporal within {WORKERS_READY_S:.0f} s; see "
                               f"{', '.join(str(w.log_path) for w in supervisor.workers.values())}")
        await asyncio.sleep(0.5)


def _report_deaths(supervisor: Supervisor) -> list:
    deaths = supervisor.check()  # raises on a configuration error or a worker that keeps dying
    for death in deaths:
        print(f"[vime] fleet worker {death.name} died ({death.cause}); restarted it", flush=True)
    return deaths


async def recover_runs(client, deaths: list) -> None:
    """Tell every run in flight at once what a dead worker was doing for it, as `vime train` tells
    its one run: the worker's started activities fail as `WorkerLost` (retried on the restarted
    worker), and after the trainer's death each run attaches a live one now, not after its
    heartbeat timeout (a minute). Best effort: the timeouts still recover a run this misses."""
    if not deaths:
        return
    try:
        async for execution in client.list_workflows(
                f"WorkflowType = '{TRAINING_WORKFLOW}' AND ExecutionStatus = 'Running'"):
            run_id = execution.id.removeprefix("train-")
            for death in deaths:
                await recover_from_worker_death(client, run_id, death.identity,
                                                f"fleet worker {death.identity} died ({death.cause})")
            if any(d.name == "trainer" for d in deaths):
                with contextlib.suppress(Exception):  # it finished meanwhile
                    await client.get_workflow_handle(execution.id).signal(TRAINER_LOST_SIGNAL)
    except Exception as e:  # noqa: BLE001
        print(f"[vime] fleet: telling the runs about the dead worker failed ({str(e)[:200]}); they notice "
              "it by their heartbeat timeouts", flush=True)


async def keep_alive(svc: TemporalService, fleets: ModelFleets, supervisor: Supervisor) -> None:
    """Once a second: a dead dev server, vLLM server or worker is restarted, and said so."""
    while True:
        for line in [await svc.check(), *await fleets.check()]:
            if line:
                print(line, flush=True)
        await recover_runs(svc.client, _report_deaths(supervisor))
        await asyncio.sleep(1.0)


def fleet_info(opts: FleetOptions, svc: TemporalService, fleets: ModelFleets) -> FleetInfo:
    host, port = fleets.url.removeprefix("http://").rsplit(":", 1)
    a = opts.args
    return FleetInfo(temporal_address=svc.address, temporal_namespace=a.temporal_namespace, store_url=a.store_url,
                     server_urls=list(fleets.server_urls), router_ip=host, router_port=int(port),
                     base_model=str(Path(a.hf_checkpoint).resolve()), max_lora_rank=opts.max_lora_rank,
                     pid=os.getpid())


async def serve(opts: FleetOptions) -> None:
    """Start every part (vLLM first: the slowest), write fleet.json once all answer, keep them alive."""
    args, fleet_dir = opts.args, opts.fleet_dir
    with RunDirLock(fleet_dir):
        remove_fleet(fleet_dir)  # a SIGKILLed fleet's
        with SampleStore.open(args.store_url):
            pass  # the schema, before the workers open it
        fleets = model_fleets(topology_of(args, check_overrides=False), run_server_args=_server_args(args),
                              router_args=list(args.router_args), run_dir=fleet_dir,
                              sync_engine=args.weight_sync_engine, lora_rank=opts.max_lora_rank)
        print(f"[vime] fleet in {fleet_dir}: starting vLLM on {args.hf_checkpoint} with LoRA up to rank "
              f"{opts.max_lora_rank} (logs in {fleet_dir})", flush=True)
        fleets.start()
        try:
            async with temporal_service(args.temporal_address, run_dir=fleet_dir,
                                        namespace=args.temporal_namespace) as svc:
                with Supervisor(_workers(opts, svc.address), stop_with=ask_all_to_stop) as supervisor:
                    await asyncio.to_thread(fleets.wait_ready)
                    await wait_for_workers(svc, args, supervisor)
                    write_fleet(fleet_dir, fleet_info(opts, svc, fleets))
                    try:
                        print(f"[vime] fleet ready in {time.time() - process_started_at():.0f} s: vime train "
                              f"--fleet {fleet_dir} --lora-rank R --run-id NAME <run flags>; Temporal "
                              f"{svc.address}" + (f", Web UI {svc.ui_url}" if svc.ui_url else ""), flush=True)
                        await keep_alive(svc, fleets, supervisor)
                    finally:
                        remove_fleet(fleet_dir)
        finally:
            fleets.__exit__()


def main(argv: list[str]) -> int:
    opts = parse_fleet_args(argv)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even where a shell started us ignoring it

    async def run() -> None:
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        await serve(opts)

    with contextlib.suppress(KeyboardInterrupt, asyncio.CancelledError):
        asyncio.run(run())
    print(f"[vime] fleet in {opts.fleet_dir} stopped: every part of it is down", flush=True)
    return 0
