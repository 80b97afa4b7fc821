"""What durable orchestration costs: the same rollouts through RolloutWorkflows vs a plain
`asyncio.gather` of `generate()` on the same vLLM server, side by side in one process.

    python bench/orchestration_overhead.py [--shape quickstart|slow] [--temporal file|memory]
                                           [--groups G] [--n N] [--max-tokens T] [--latency S] [--repeats 3]

Both paths run the same prompts, the same generate and the same reward; the Temporal path adds a
workflow per prompt group, an activity, the store write and the refs coming back. Prints
rollouts/s for each, their ratio, and the milliseconds added per rollout.

Shapes: `quickstart` is one quickstart step (8 groups x 8 samples x 16 tokens); `slow` gives
every rollout a declared latency of 1 s before it generates (as a tool call or an environment
would), 16 groups x 8 samples: there the orchestration's cost should vanish in the rollout's.
`--temporal file` (the default) is the dev server on a SQLite file, as `vime train` runs it;
`memory` is the in-memory dev server.

A throughput of failed rollouts measures nothing: if any rollout fails (a FAILED sample, an
error in its metadata, a failed workflow, an engine that stops answering) the script prints
one line naming how many failed and the first error, prints no figures and exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import re
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.testing import WorkflowEnvironment  # noqa: E402
from temporalio.worker import Worker  # noqa: E402

from activities.rollout import RolloutActivities  # noqa: E402
from vime.config.args import parse_args  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.rollout.data_source import RolloutDataSource  # noqa: E402
from vime.rollout.generate import close_engine_clients  # noqa: E402
from vime.rollout.group import run_group  # noqa: E402
from vime.store import SampleStore  # noqa: E402
from vime.temporal.client import connect  # noqa: E402
from vime.temporal.dev_server import TemporalDevServer, temporal_cli_path  # noqa: E402
from vime.temporal.search_attributes import ALL_KEYS  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402
from vime.types import Sample  # noqa: E402
from workflows.rollout import RolloutInput, RolloutOutput, RolloutWorkflow  # noqa: E402

FINISHED = (Sample.Status.COMPLETED, Sample.Status.TRUNCATED)
SHAPES = {"quickstart": {"groups": 8, "n": 8, "max_tokens": 16, "latency": 0.0},
          "slow": {"groups": 16, "n": 8, "max_tokens": 16, "latency": 1.0}}
LATENCY_HOOK = """
import asyncio
from vime.rollout.generate import generate as vllm_generate

async def generate(args, sample, sampling_params):
    await asyncio.sleep({latency})  # the declared latency of the environment
    return await vllm_generate(args, sample, sampling_params)
"""
HEALTH_FAILURES = 3  # consecutive /health failures that mean the engine is gone


@dataclass
class Failures:
    """Work that did not finish, over the whole run; `first` names the first cause. Shared by the
    benchmarks (`concurrency`, `session_affinity`): any failure prints this line and no figures."""

    failed: int = 0
    total: int = 0
    first: str | None = None
    name: str = "orchestration_overhead"  # the benchmark the line is printed by
    unit: str = "rollouts"  # what failed: rollouts, requests

    def add(self, failed: int, total: int, error: str | None) -> None:
        self.failed += failed
        self.total += total
        if failed and self.first is None:
            self.first = " ".join(str(error).split())[:400]

    def line(self) -> str:
        return (f"{self.name}: FAILED: {self.failed} of {self.total} {self.unit} failed; first error: "
                f"{self.first}; no figures printed")


def sample_error(sample: Sample) -> str | None:
    """Why `sample` is not a finished rollout (None when it is)."""
    meta = sample.metadata or {}
    error = meta.get("error") or meta.get("infra_failure")
    if error is None and sample.status not in FINISHED:
        error = f"sample {sample.index} ended {sample.status.value}"
    return error


def count_group_failures(failures: Failures, groups: list[list[list[Sample]]]) -> None:
    rollouts = [rollout for group in groups for rollout in group]
    errors = [e for rollout in rollouts for e in map(sample_error, rollout) if e]
    failed = sum(any(sample_error(s) for s in rollout) for rollout in rollouts)
    failures.add(failed, len(rollouts), errors[0] if errors else None)


def count_workflow_failures(failures: Failures, outputs: list[RolloutOutput], n: int) -> None:
    failed = sum(min(n, o.errors + o.infra) if o.status != "failed" else n for o in outputs)
    first = next((o.first_error or f"group {o.position} ended {o.status}" for o in outputs
                  if o.status == "failed" or o.errors or o.infra), None)
    failures.add(failed, n * len(outputs), first)


def engine_error(log_path: Path | None) -> str:
    """The first exception vLLM logged at ERROR level (`... ERROR ... [file:line] RuntimeError: ...`),
    to say why the engine stopped."""
    if log_path is None or not log_path.exists():
        return ""
    for line in log_path.read_text(errors="replace").splitlines():
        match = re.search(r"ERROR .*?\] (\w+(?:Error|Exception): .+)$", line)
        if match:
            return f"; its log says {match.group(1)[:300]}"
    return ""


async def watch_engine(url: str, log_path: Path | None) -> None:
    """Return (never raise) only when the engine stops answering `/health`; a workflow whose
    activity retries an infra failure would otherwise wait for it without end."""
    misses = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        while misses < HEALTH_FAILURES:
            await asyncio.sleep(2.0)
            try:
                async with http.get(url + "/health") as resp:
                    misses = 0 if resp.status == 200 else misses + 1
            except (aiohttp.ClientError, OSError):
                misses += 1
    raise RuntimeError(f"vLLM at {url} stopped answering /health{engine_error(log_path)}")


async def unless_engine_dies(work, url: str, log_path: Path | None):
    """`await work`, but fail as soon as the engine is gone."""
    task, watch = asyncio.ensure_future(work), asyncio.ensure_future(watch_engine(url, log_path))
    try:
        done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        return await (task if task in done else watch)
    finally:
        for t in (task, watch):
            t.cancel()


def vime_args(work: Path, model: str, url: str, cli: argparse.Namespace):
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Write item {i}."}) + "\n" for i in range(256)))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    hook = []
    if cli.latency:
        (work / "latency_hook.py").write_text(LATENCY_HOOK.format(latency=cli.latency))
        sys.path.insert(0, str(work))
        hook = ["--custom-generate-function-path", "latency_hook.generate"]
    return parse_args([*hook, "--hf-checkpoint", model, "--prompt-data", str(prompts), "--input-key", "prompt",
                       "--apply-chat-template", "--n-samples-per-prompt", str(cli.n), "--rm-type", "random",
                       "--rollout-max-response-len", str(cli.max_tokens), "--run-dir", str(work / "run"),
                       "--vllm-router-ip", host, "--vllm-router-port", port])


async def direct(args, positions: list[int], failures: Failures) -> float:
    source = RolloutDataSource(args)
    t0 = time.perf_counter()
    groups = await asyncio.gather(*(run_group(args, source.prompt_group(p)) for p in positions))
    elapsed = time.perf_counter() - t0
    count_group_failures(failures, groups)
    return elapsed


async def through_workflows(client, args, positions: list[int], queue: str, run_id: str, failures: Failures,
                            local: bool) -> float:
    t0 = time.perf_counter()
    outputs = await asyncio.gather(*(client.execute_workflow(
        RolloutWorkflow.run, RolloutInput(run_id, 0, p, 0, local_activity=local), id=f"{run_id}-rollout-{p}",
        task_queue=queue, result_type=RolloutOutput) for p in positions))
    elapsed = time.perf_counter() - t0
    count_workflow_failures(failures, outputs, args.n_samples_per_prompt)
    return elapsed


@contextlib.asynccontextmanager
async def temporal(cli: argparse.Namespace, work: Path):
    """A Temporal client: on the dev server with a SQLite file (as `vime train`), or in memory."""
    if cli.temporal == "memory":
        async with await WorkflowEnvironment.start_local(dev_server_existing_path=str(temporal_cli_path()),
                                                         search_attributes=ALL_KEYS) as env:
            yield env.client
        return
    server = TemporalDevServer(work / "temporal", headless=True).start()
    try:
        yield await connect(server.address)
    finally:
        server.stop()


PATHS = ("direct", "activity", "local")
LABELS = {"direct": "direct asyncio.gather", "activity": "RolloutWorkflows, activity",
          "local": "RolloutWorkflows, local activity (vime train)"}


async def measure(cli: argparse.Namespace, client, args, store, url: str, log_path: Path | None,
                  failures: Failures) -> dict[str, list[float]]:
    """Warm up, then `--repeats` rounds of every path; stops at the first round with a failure."""
    queue = "bench-rollout"
    acts = RolloutActivities(args, store)
    times: dict[str, list[float]] = {name: [] for name in PATHS}
    async with Worker(client, task_queue=queue, workflows=[RolloutWorkflow],
                      activities=[acts.generate_group], max_concurrent_activities=256):
        await direct(args, list(range(cli.groups)), failures)  # warm-up: tokenizer, prefix cache, connections
        base = cli.groups
        for r in range(cli.repeats):
            # rotate the order so drift on a noisy machine hits every path alike
            for name in PATHS[r % 3:] + PATHS[:r % 3]:
                if failures.failed:
                    return times
                positions = list(range(base, base + cli.groups))  # fresh prompts: no prefix-cache head start
                base += cli.groups
                run_id = f"bench-{uuid.uuid4().hex[:8]}"
                store.ensure_run(run_id)
                work = (direct(args, positions, failures) if name == "direct" else
                        through_workflows(client, args, positions, queue, run_id, failures, name == "local"))
                times[name].append(await unless_engine_dies(work, url, log_path))
    return times


def report(cli: argparse.Namespace, times: dict[str, list[float]]) -> None:
    rollouts = cli.groups * cli.n
    med = {name: statistics.median(times[name]) for name in PATHS}
    d = med["direct"]
    print(f"orchestration_overhead: {cli.shape} shape, {cli.groups} groups x {cli.n} samples x {cli.max_tokens} "
          f"tokens, {cli.latency:g} s declared latency per rollout, Temporal dev server {cli.temporal}, "
          f"median of {cli.repeats}")
    for name in PATHS:
        print(f"  {LABELS[name]:<46}: {rollouts / med[name]:8.1f} rollouts/s ({med[name]:.2f} s)")
    for name in PATHS[1:]:
        t = med[name]
        print(f"  {name:>8}: throughput ratio (workflows / direct): {d / t:.3f}; added per rollout "
              f"{(t - d) / rollouts * 1000:.2f} ms, per group workflow {(t - d) / cli.groups * 1000:.1f} ms")


async def main(cli: argparse.Namespace) -> int:
    configure_logging("console", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="vime-bench-"))
    model = str(tiny_model_dir())
    server = None
    if cli.vllm_url is None:
        server = VLLMServer(model, server_args=["--max-model-len", "1024"], log_path=work / "vllm.log").start()
        server.wait_healthy()
    url = cli.vllm_url or server.url
    failures = Failures()
    try:
        args = vime_args(work, model, url, cli)
        async with temporal(cli, work) as client:
            try:
                times = await measure(cli, client, args, SampleStore.open(args.run_dir), url,
                                      server.log_path if server else None, failures)
            except Exception as e:  # noqa: BLE001 - a batch that raised is a failed batch, reported below
                failures.add(cli.groups * cli.n, cli.groups * cli.n, f"{type(e).__name__}: {e}")
    finally:
        await close_engine_clients()
        if server:
            server.stop()
    if failures.failed:
        print(failures.line(), file=sys.stderr)
        return 1
    report(cli, times)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=sorted(SHAPES), default="quickstart")
    p.add_argument("--temporal", choices=("file", "memory"), default="file")
    p.add_argument("--groups", type=int, default=None, help="prompt groups per round (default: the shape's)")
    p.add_argument("--n", type=int, default=None, help="samples per group (default: the shape's)")
    p.add_argument("--max-tokens", type=int, default=None, help="tokens per sample (default: the shape's)")
    p.add_argument("--latency", type=float, default=None, help="declared seconds per rollout (default: the shape's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--vllm-url", default=None, help="use a running server instead of starting one")
    cli = p.parse_args()
    for key, value in SHAPES[cli.shape].items():
        if getattr(cli, key) is None:
            setattr(cli, key, value)
    sys.exit(asyncio.run(main(cli)))
