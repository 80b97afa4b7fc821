"""`vime train`: start (or resume) a run on this machine and follow it to the end.

What is not given is started here: the Temporal dev server (no `--temporal-address`), vLLM
servers and a router (no `--vllm-router-ip`), and always the run's workers (rollout queue,
trainer) as supervised child processes. Then the `train-<run>` workflow is started — or, if it
is already running, simply followed — and its progress printed until it finishes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from vime.engine.server import VLLMServer
from vime.engine.weight_sync import weight_sync_server_args
from vime.errors import ConfigError
from vime.log import get_logger
from vime.store import SampleStore
from vime.supervisor import Supervisor, WorkerProcess
from vime.temporal.client import temporal_service
from vime.train.checkpoint import latest_checkpoint, read_state
from workflows.training import TrainingConfig, TrainingInput, TrainingState, TrainingWorkflow

log = get_logger(__name__)


@dataclass
class Engines:
    router_url: str  # what generate functions call
    server_urls: list[str]  # where weights are pushed


DEFAULT_ROLLOUT_FUNCTION = "vime.rollout.vllm_rollout.generate_rollout"
HOOK_FLAGS = ("rollout_function_path", "custom_generate_function_path", "dynamic_sampling_filter_path",
              "buffer_filter_path", "eval_function_path", "custom_rm_path", "data_source_path")


def check_args(args) -> None:
    """Fail before starting anything: required flags, and every hook path must load."""
    from vime.plugins import load_hook

    missing = [f"--{n.replace('_', '-')}" for n in ("hf_checkpoint", "prompt_data", "rollout_batch_size", "num_rollout")
               if getattr(args, n) in (None, "")]
    if missing:
        raise ConfigError(f"vime train needs {', '.join(missing)}")
    for dest in HOOK_FLAGS:
        load_hook(args, dest)


@contextlib.contextmanager
def engines(args, run_dir: Path) -> Iterator[Engines]:
    """The rollout servers: the ones given by --vllm-router-ip/port, else N started here."""
    if args.vllm_router_ip and args.vllm_router_port:
        url = f"http://{args.vllm_router_ip}:{args.vllm_router_port}"
        yield Engines(url, list(args.vllm_server_urls or [url]))
        return
    server_args = weight_sync_server_args() + list(args.vllm_server_args)
    servers = [VLLMServer(args.hf_checkpoint, server_args=server_args, log_path=run_dir / f"vllm-{i}.log")
               for i in range(args.vllm_num_servers)]
    with contextlib.ExitStack() as stack:
        print(f"[vime] starting {len(servers)} vLLM server(s) on {args.hf_checkpoint}")
        with ThreadPoolExecutor(len(servers)) as pool:
            list(pool.map(lambda s: stack.enter_context(s), servers))
        urls = [s.url for s in servers]
        if len(servers) == 1:
            yield Engines(urls[0], urls)
            return
        from vime.router.launch import Router

        router = stack.enter_context(Router(urls, args.router_args, log_path=run_dir / "router.log"))
        yield Engines(router.url, urls)


def initial_state(args) -> TrainingState:
    """Step 0, or the state of the newest checkpoint under --load."""
    path = latest_checkpoint(args.load)
    if path is None:
        return TrainingState()
    state = read_state(path)
    print(f"[vime] resuming from {path} (step {state['step']})")
    return TrainingState(step=state["step"], data_position=state["data_position"],
                         weight_version=state["weight_version"], checkpoint_step=state["step"], checkpoint=str(path))


def training_config(args, urls: Engines) -> TrainingConfig:
    return TrainingConfig(
        run_id=args.run_id, num_rollout=args.num_rollout, rollout_batch_size=args.rollout_batch_size,
        over_sampling_batch_size=args.over_sampling_batch_size or args.rollout_batch_size,
        engine_urls=urls.server_urls, trainer_task_queue=args.trainer_task_queue, max_staleness=args.max_staleness,
        save=str(Path(args.save).resolve()) if args.save else None, save_interval=args.save_interval,
        trainer_heartbeat_seconds=args.heartbeat_timeout, rollout_heartbeat_seconds=args.heartbeat_timeout,
        custom_rollout_function=args.rollout_function_path != DEFAULT_ROLLOUT_FUNCTION,
        rollout_task_queue=args.rollout_task_queue, rollout_workflow=args.rollout_workflow,
        n_samples_per_prompt=args.n_samples_per_prompt, sandbox_task_queue=args.sandbox_task_queue,
    )


def format_progress(m: dict, total: int) -> str:
    """One line per finished step: a bar, reward, KL, length, throughput and time per phase."""
    done = m["step"] + 1
    bar = "#" * int(20 * done / max(1, total))
    kl = m.get("kl_loss", m.get("ref_kl"))
    return (f"[{bar:<20}] step {done}/{total} | reward {m.get('reward_mean', float('nan')):.3f}"
            + (f" | kl {kl:.4f}" if kl is not None else "")
            + f" | len {m.get('response_length_mean', 0):.1f} | {m.get('train_tokens_per_second', 0):.0f} tok/s"
            + f" | rollout {m.get('rollout_wait_seconds', 0):.1f}s train {m.get('train_phase_seconds', 0):.1f}s"
            + f" sync {m.get('sync_seconds', 0):.2f}s (pause {m.get('sync_pause_seconds', 0):.3f}s)")


async def follow(handle: WorkflowHandle, supervisor: Supervisor, poll: float = 1.0) -> TrainingState:
    """Print each finished step; restart dead workers; return the final state."""
    shown = -1
    result = asyncio.create_task(handle.result())
    while not result.done():
        await asyncio.wait([result], timeout=poll)
        for name in supervisor.check():
            print(f"[vime] worker {name} died; restarted it (the run continues)")
        with contextlib.suppress(Exception):  # a query can fail while a worker restarts: ask again
            p = await handle.query(TrainingWorkflow.progress)
            for m in p.get("metrics", []):
                if m["step"] > shown:
                    shown = m["step"]
                    print(format_progress(m, p.get("num_rollout") or 0), flush=True)
    return await result


async def start_or_attach(client, args, urls: Engines) -> WorkflowHandle:
    """Start `train-<run>`, or follow it if it is running; a finished run is not started again."""
    workflow_id = f"train-{args.run_id}"
    try:
        return await client.start_workflow(
            TrainingWorkflow.run, TrainingInput(training_config(args, urls), initial_state(args)),
            id=workflow_id, task_queue=args.rollout_task_queue, result_type=TrainingState,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE)
    except WorkflowAlreadyStartedError:
        print(f"[vime] run {args.run_id} has already finished; showing its result (use a new --run-id to train again)")
        return client.get_workflow_handle(workflow_id, result_type=TrainingState)


async def run_training(args) -> TrainingState:
    check_args(args)
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    with SampleStore.open(args.store_url) as store:
        store.ensure_run(args.run_id, {k: v for k, v in args.to_dict().items() if k != "vllm_config_data"})
    async with temporal_service(args.temporal_address, run_dir=run_dir, namespace=args.temporal_namespace) as svc:
        print(f"[vime] run {args.run_id} in {run_dir}; Temporal {svc.address}"
              + (f", Web UI {svc.ui_url}" if svc.ui_url else ""))
        with engines(args, run_dir) as urls:
            host, port = urls.router_url.removeprefix("http://").rsplit(":", 1)
            worker_argv = [*args.argv, "--temporal-address", svc.address, "--vllm-router-ip", host,
                           "--vllm-router-port", port, "--vllm-server-urls", *urls.server_urls]
            workers = [WorkerProcess("rollout", "workers.rollout", worker_argv, run_dir / "worker-rollout.log"),
                       WorkerProcess("trainer", "workers.trainer", worker_argv, run_dir / "worker-trainer.log")]
            with Supervisor(workers) as supervisor:
                handle = await start_or_attach(svc.client, args, urls)
                t0 = time.monotonic()
                state = await follow(handle, supervisor)
    summary = {"run_id": args.run_id, "steps": state.step, "weight_version": state.weight_version,
               "seconds": round(time.monotonic() - t0, 1), "checkpoint": state.checkpoint,
               "metrics": state.metrics}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"[vime] run {args.run_id} finished: {state.step} steps; summary in {run_dir / 'summary.json'}")
    return state


async def _run_until_terminated(args) -> TrainingState:
    """SIGTERM cancels the run like Ctrl-C does, so every service and worker started here stops
    (the run itself lives on in Temporal and resumes with the same command)."""
    task = asyncio.current_task()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run_training(args)


def main(args) -> int:
    try:
        asyncio.run(_run_until_terminated(args))
    except asyncio.CancelledError:
        print("[vime] stopped; run the same command again to resume", file=sys.stderr)
        return 143
    return 0
