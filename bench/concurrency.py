"""Scale on one machine: 1,000 agent-shaped rollouts in flight at once, through RolloutWorkflows on
the dev server and one vLLM CPU server, then the same rollouts as a plain `asyncio.gather`.

    python bench/concurrency.py [--rollouts 1000] [--n 8] [--turns 3] [--delay 5] [--max-tokens 8]
                                [--temporal file|memory] [--vllm-url URL]

Each rollout is a multi-turn agent session through vime's `OpenAIAdapter` (one adapter per
process, as the coding agent uses it): `--turns` Chat Completions turns of `--max-tokens`
tokens, each followed by a declared environment delay of `--delay` seconds (a tool call) and an
observation message; the session's trajectory becomes the rollout's samples. Rollouts run as
`--rollouts / --n` group workflows with local activities, on a worker configured as `vime
train`'s rollout worker.

Prints the peak number of sessions open at once (the goal: all of them), the wall time of both
paths, Temporal's share of the workflow path's wall time, and how many samples the store holds
against how many the rollouts made. Any failed or lost rollout fails the benchmark: one line
naming how many and the first error, no figures, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio.worker import Worker  # noqa: E402

from activities.rollout import RolloutActivities  # noqa: E402
from bench.orchestration_overhead import (  # noqa: E402
    Failures, direct, temporal, through_workflows, unless_engine_dies)
from vime.config.args import parse_args  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.rollout.generate import close_engine_clients  # noqa: E402
from vime.store import SampleStore  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402
from workers.rollout import (  # noqa: E402
    ROLLOUT_ACTIVITY_SLOTS, ROLLOUT_LOCAL_ACTIVITY_SLOTS, ROLLOUT_WORKFLOW_TASK_SLOTS)
from workflows.rollout import RolloutWorkflow  # noqa: E402

AGENT_HOOK = '''
import asyncio, uuid
import aiohttp
from vime.agent.adapters import OpenAIAdapter
from vime.agent.trajectory import segments_to_samples
from vime.rollout.generate import router_url
from vime.rollout.tokenization import tokenizer_for

TURNS, DELAY, MAX_TOKENS = {turns}, {delay}, {max_tokens}
adapter = http = None
in_flight = peak = made = 0


async def turn(url, session_id, messages):
    body = {{"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 1.0}}
    async with http.post(url + "/v1/chat/completions", json=body,
                         headers={{"Authorization": f"Bearer {{session_id}}"}}) as resp:
        reply = await resp.json(content_type=None)
        if resp.status != 200:
            raise RuntimeError(f"adapter answered HTTP {{resp.status}}: {{str(reply)[:300]}}")
    return reply["choices"][0]["message"]


async def generate(args, sample, sampling_params):
    """One agent session: TURNS turns, each followed by the environment's DELAY and an observation."""
    global adapter, http, in_flight, peak, made
    if adapter is None:
        adapter = OpenAIAdapter(tokenizer_for(args), router_url(args), max_turns=TURNS + 1)
        http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    url = await adapter.start()
    session_id = f"agent-{{uuid.uuid4().hex}}"
    adapter.open_session(session_id, {{"max_tokens": MAX_TOKENS, "temperature": 1.0}})
    in_flight += 1
    peak = max(peak, in_flight)
    try:
        messages = [{{"role": "system", "content": "You are an agent with a terminal."}},
                    {{"role": "user", "content": str(sample.prompt)}}]
        for i in range(TURNS):
            reply = await turn(url, session_id, messages)
            messages.append({{"role": "assistant", "content": reply.get("content") or ""}})
            await asyncio.sleep(DELAY)  # the declared environment delay: a tool call
            messages.append({{"role": "user", "content": f"observation {{i}}: exit code 0"}})
    finally:
        in_flight -= 1
        segments = await adapter.finish_session(session_id)
    samples = segments_to_samples(segments, rollout_id=session_id, base=sample)
    made += len(samples)  # a session whose history the client re-rendered differently has more segments
    return samples
'''


def vime_args(work: Path, model: str, url: str, cli: argparse.Namespace):
    prompts = work / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"Fix bug {i} in the repository."}) + "\n"
                               for i in range(2 * cli.rollouts // cli.n + 1)))
    (work / "agent_hook.py").write_text(AGENT_HOOK.format(turns=cli.turns, delay=cli.delay,
                                                          max_tokens=cli.max_tokens))
    sys.path.insert(0, str(work))
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return parse_args(["--custom-generate-function-path", "agent_hook.generate", "--hf-checkpoint", model,
                       "--prompt-data", str(prompts), "--input-key", "prompt", "--n-samples-per-prompt", str(cli.n),
                       "--rm-type", "random", "--rollout-max-response-len", str(cli.max_tokens),
                       "--run-dir", str(work / "run"), "--vllm-router-ip", host, "--vllm-router-port", port])


def stored_samples(store: SampleStore, run_id: str) -> int:
    return store.count_samples(run_id)


async def measure(cli: argparse.Namespace, client, args, store, url: str, log_path: Path | None,
                  failures: Failures) -> dict:
    """A warm-up group (tokenizer, adapter, connections), then the workflow path on positions
    [0, G) and the direct path on [G, 2G): fresh prompts each, so neither reuses the other's
    prefix cache."""
    hook = importlib.import_module("agent_hook")
    groups = cli.rollouts // cli.n
    queue, run_id = "bench-concurrency", f"bench-{uuid.uuid4().hex[:8]}"
    store.ensure_run(run_id)
    acts = RolloutActivities(args, store)
    figures: dict = {}
    async with Worker(client, task_queue=queue, workflows=[RolloutWorkflow], activities=[acts.generate_group],
                      max_concurrent_activities=ROLLOUT_ACTIVITY_SLOTS,
                      max_concurrent_local_activities=ROLLOUT_LOCAL_ACTIVITY_SLOTS,
                      max_concurrent_workflow_tasks=ROLLOUT_WORKFLOW_TASK_SLOTS):
        await unless_engine_dies(direct(args, [2 * groups], failures), url, log_path)
        if failures.failed:
            return figures
        hook.peak = hook.made = 0
        figures["workflows_s"] = await unless_engine_dies(
            through_workflows(client, args, list(range(groups)), queue, run_id, failures, True), url, log_path)
        figures["workflows_peak"], figures["made"], hook.peak = hook.peak, hook.made, 0
        figures["stored"] = stored_samples(store, run_id)
        if failures.failed:
            return figures
        figures["direct_s"] = await unless_engine_dies(
            direct(args, list(range(groups, 2 * groups)), failures), url, log_path)
        figures["direct_peak"] = hook.peak
    await hook.http.close()
    await hook.adapter.stop()
    return figures


def report(cli: argparse.Namespace, f: dict) -> None:
    wf, d = f["workflows_s"], f["direct_s"]
    print(f"concurrency: {cli.rollouts} agent rollouts ({cli.rollouts // cli.n} groups x {cli.n}), {cli.turns} turns "
          f"of {cli.max_tokens} tokens through OpenAIAdapter, {cli.delay:g} s environment delay per turn, "
          f"Temporal dev server {cli.temporal}, one vLLM CPU server")
    print(f"  peak sessions in flight: workflows {f['workflows_peak']}, direct {f['direct_peak']} "
          f"(of {cli.rollouts})")
    print(f"  wall time: RolloutWorkflows (local activities) {wf:.1f} s, direct asyncio.gather {d:.1f} s")
    print(f"  Temporal's share of the workflow path: {max(0.0, wf - d) / wf:.1%} ({wf - d:+.1f} s)")
    print(f"  stored samples: {f['stored']} of {f['made']} made by {cli.rollouts} sessions; failed rollouts 0, "
          "lost 0")


async def main(cli: argparse.Namespace) -> int:
    configure_logging("console", "WARNING")
    work = Path(tempfile.mkdtemp(prefix="vime-bench-"))
    model = str(tiny_model_dir())
    server = log_path = None
    if cli.vllm_url is None:
        log_path = work / "vllm.log"
        server = VLLMServer(model, server_args=["--max-model-len", "1024"], log_path=log_path).start()
        server.wait_healthy()
    url = cli.vllm_url or server.url
    failures = Failures(name="concurrency")
    try:
        args = vime_args(work, model, url, cli)
        async with temporal(cli, work) as client:
            with SampleStore.open(work / "store") as store:
                t0 = time.perf_counter()
                figures = await measure(cli, client, args, store, url, log_path, failures)
                figures["total_s"] = time.perf_counter() - t0
    except Exception as exc:  # a dead engine, a refused connection: no figures either
        failures.add(1, max(failures.total, 1), f"{type(exc).__name__}: {exc}")
    finally:
        await close_engine_clients()
        if server is not None:
            server.stop()
    if failures.failed:
        print(failures.line(), file=sys.stderr)
        return 1
    if figures["stored"] != figures["made"]:
        print(f"concurrency: FAILED: the store holds {figures['stored']} samples of the {figures['made']} "
              "the rollouts made; no figures printed", file=sys.stderr)
        return 1
    report(cli, figures)
    return 0


def parse_cli(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rollouts", type=int, default=1000)
    p.add_argument("--n", type=int, default=8, help="samples per group (one group workflow per prompt)")
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--delay", type=float, default=5.0, help="declared environment delay after each turn, seconds")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--temporal", choices=("file", "memory"), default="file")
    p.add_argument("--vllm-url", default=None, help="an already running vLLM server (default: start one)")
    cli = p.parse_args(argv)
    if cli.rollouts % cli.n:
        p.error(f"--rollouts {cli.rollouts} is not a multiple of --n {cli.n}: give whole groups")
    return cli


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_cli())))
