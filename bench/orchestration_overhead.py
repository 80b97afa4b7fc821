"""What durable orchestration costs: the same rollouts through RolloutWorkflows vs a plain
`asyncio.gather` of `generate()` on the same vLLM server, side by side in one process.

    python bench/orchestration_overhead.py [--groups 16] [--n 8] [--max-tokens 16] [--repeats 3]

Both paths run the same prompts, the same default generate and the same reward; the Temporal
path adds a workflow per prompt group, an activity, the store write and the refs coming back.
Prints rollouts/s for each, their ratio, and the milliseconds added per rollout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.testing import WorkflowEnvironment  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.rollout import RolloutActivities  # noqa: E402
from vime.args import parse_args  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.rollout.data_source import RolloutDataSource  # noqa: E402
from vime.rollout.generate import close_engine_clients  # noqa: E402
from vime.rollout.group import run_group  # noqa: E402
from vime.store import SampleStore  # noqa: E402
from vime.temporal.dev_server import temporal_cli_path  # noqa: E402
from vime.temporal.search_attributes import ALL_KEYS  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402
from workflows.rollout import RolloutInput, RolloutOutput, RolloutWorkflow  # noqa: E402


def vime_args(work: Path, model: str, url: str, cli: argparse.Namespace):
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Write item {i}."}) + "\n" for i in range(256)))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return parse_args(["--hf-checkpoint", model, "--prompt-data", str(prompts), "--input-key", "prompt",
                       "--apply-chat-template", "--n-samples-per-prompt", str(cli.n), "--rm-type", "random",
                       "--rollout-max-response-len", str(cli.max_tokens), "--run-dir", str(work / "run"),
                       "--vllm-router-ip", host, "--vllm-router-port", port])


async def direct(args, positions: list[int]) -> float:
    source = RolloutDataSource(args)
    t0 = time.perf_counter()
    await asyncio.gather(*(run_group(args, source.prompt_group(p)) for p in positions))
    return time.perf_counter() - t0


async def through_workflows(client, args, positions: list[int], queue: str, run_id: str) -> float:
    t0 = time.perf_counter()
    await asyncio.gather(*(client.execute_workflow(
        RolloutWorkflow.run, RolloutInput(run_id, 0, p, 0), id=f"{run_id}-rollout-{p}", task_queue=queue,
        result_type=RolloutOutput) for p in positions))
    return time.perf_counter() - t0


async def main(cli: argparse.Namespace) -> None:
    configure_logging("console", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="vime-bench-"))
    model = str(tiny_model_dir())
    server = None
    if cli.vllm_url is None:
        server = VLLMServer(model, server_args=["--max-model-len", "1024"], log_path=work / "vllm.log").start()
        server.wait_healthy()
    url = cli.vllm_url or server.url
    try:
        args = vime_args(work, model, url, cli)
        env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(temporal_cli_path()),
                                                    search_attributes=ALL_KEYS)
        store = SampleStore.open(args.run_dir)
        queue = "bench-rollout"
        acts = RolloutActivities(args, store)
        async with env, Worker(env.client, task_queue=queue, workflows=[RolloutWorkflow],
                               activities=[acts.generate_group], max_concurrent_activities=256):
            await direct(args, list(range(cli.groups)))  # warm-up: tokenizer, prefix cache, connections
            times: dict[str, list[float]] = {"direct": [], "temporal": []}
            base = cli.groups
            for r in range(cli.repeats):
                positions = list(range(base, base + cli.groups))
                base += cli.groups
                run_id = f"bench-{uuid.uuid4().hex[:8]}"
                store.ensure_run(run_id)
                # alternate the order so drift on a noisy machine hits both alike
                if r % 2 == 0:
                    times["direct"].append(await direct(args, positions))
                    times["temporal"].append(await through_workflows(env.client, args, positions, queue, run_id))
                else:
                    times["temporal"].append(await through_workflows(env.client, args, positions, queue, run_id))
                    times["direct"].append(await direct(args, positions))
        rollouts = cli.groups * cli.n
        d, t = statistics.median(times["direct"]), statistics.median(times["temporal"])
        print(f"orchestration_overhead: {cli.groups} groups x {cli.n} samples x {cli.max_tokens} tokens, "
              f"median of {cli.repeats}")
        print(f"  direct asyncio.gather : {rollouts / d:8.1f} rollouts/s ({d:.2f} s)")
        print(f"  RolloutWorkflows      : {rollouts / t:8.1f} rollouts/s ({t:.2f} s)")
        print(f"  throughput ratio (workflows / direct): {d / t:.3f}")
        print(f"  added per rollout: {(t - d) / rollouts * 1000:.2f} ms; per group workflow: {(t - d) / cli.groups * 1000:.1f} ms")
    finally:
        await close_engine_clients()
        if server:
            server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, default=16)
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vllm-url", default=None, help="use a running server instead of starting one")
    asyncio.run(main(p.parse_args()))
