"""What the OpenAI adapter adds to a turn: Chat Completions through `OpenAIAdapter` vs the same
token ids sent straight to vLLM's `/inference/v1/generate`, per turn, p50 and p99.

    python bench/adapter_overhead.py [--sessions 4] [--turns 6] [--max-tokens 16] [--vllm-url URL]

Each session is a coding-agent style conversation (a long system prompt, three tools with JSON
schemas, tool calls and file-sized tool results) that grows by one round per turn, sent
non-streaming with plain aiohttp, as an SDK would. Right after each adapter turn the exact ids
and sampling parameters the adapter sent to vLLM are posted directly in one non-streamed
request (`ignore_eos` and the session's `seed`, so both legs sample the same `--max-tokens`
tokens). The adapter's share is everything else: JSON in and out, checks, the chat template,
the prefix match, tokenizing the new text, decoding and parsing, and the engine client's
streaming.

A turn that fails (an HTTP error on either leg, a broken connection) is not a timing: the
script then prints one line naming how many turns failed and the first error, prints no
figures and exits 1.

A server this script starts runs without prefix caching, so both legs prefill the same work;
on a `--vllm-url` server with caching the direct leg reuses the prefix the adapter leg just
warmed, which overstates the overhead.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from vime.agent.adapters import OpenAIAdapter  # noqa: E402
from vime.engine.client import GENERATE_ROUTE, EngineClient, session_headers  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402

SYSTEM = ("You are a coding agent working in a Python repository. Read files before editing them, "
          "run the tests after every change, keep diffs small, and explain what you changed. ") * 12


def tool(name: str, description: str, **props: str) -> dict:
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": {k: {"type": "string", "description": v} for k, v in props.items()},
        "required": list(props)}}}


TOOLS = [tool("read_file", "Read a file of the repository.", path="Path relative to the root."),
         tool("run_command", "Run a shell command in the sandbox.", command="The command line.", cwd="Directory."),
         tool("edit_file", "Replace text in a file.", path="File path.", old="Exact text.", new="Replacement.")]


def tool_round(i: int) -> list[dict]:
    """One assistant tool call and its (file-sized) result, as an agent client replays them."""
    call = {"id": f"call_{i:04d}", "type": "function",
            "function": {"name": "read_file", "arguments": json.dumps({"path": f"pkg/module_{i}.py"})}}
    body = "".join(f"def helper_{i}_{j}(x):\n    return x * {j} + {i}\n\n" for j in range(12))
    return [{"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": body}]


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class TurnFailed(Exception):
    """One turn of the benchmark did not complete; the message says how."""


@dataclass
class Timings:
    adapter: list[float] = field(default_factory=list)
    direct: list[float] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    turns: int = 0
    failed: int = 0
    first_error: str | None = None

    def fail(self, error: BaseException) -> None:
        self.failed += 1
        if self.first_error is None:
            self.first_error = " ".join(f"{type(error).__name__}: {error}".split())[:400]


async def post(http: aiohttp.ClientSession, url: str, body: dict, headers: dict) -> tuple[dict, float]:
    """POST `body`; the decoded answer and the seconds it took, or `TurnFailed`."""
    t0 = time.perf_counter()
    try:
        async with http.post(url, json=body, headers=headers) as resp:
            reply = await resp.json(content_type=None)
    except (aiohttp.ClientError, OSError, ValueError) as e:
        raise TurnFailed(f"POST {url}: {e!r}") from e
    elapsed = time.perf_counter() - t0
    if resp.status != 200 or not reply.get("choices"):
        raise TurnFailed(f"POST {url} answered HTTP {resp.status}: {str(reply)[:300]}")
    return reply, elapsed


async def turn(http, base: str, url: str, sid: str, messages: list[dict], sent: list) -> tuple[dict, float, float]:
    """One adapter turn, then the same ids and parameters straight to vLLM."""
    body = {"model": "bench", "messages": messages, "tools": TOOLS}
    reply, adapter_s = await post(http, base + "/v1/chat/completions", body, {"Authorization": f"Bearer {sid}"})
    ids, params = sent[-1]
    direct = {"token_ids": ids, "sampling_params": {**params, "logprobs": 0}}
    _, direct_s = await post(http, url + GENERATE_ROUTE, direct, session_headers(sid))
    return reply, adapter_s, direct_s


async def run(cli: argparse.Namespace, url: str) -> Timings:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    sent: list[tuple[list[int], dict]] = []
    generate = EngineClient.generate

    async def recording(self, token_ids, sampling_params=None, **kw):
        sent.append((list(token_ids), dict(sampling_params or {})))
        return await generate(self, token_ids, sampling_params, **kw)

    EngineClient.generate = recording  # the ids the adapter sends, to replay them directly
    adapter = OpenAIAdapter(tokenizer, url, model_name="bench")
    timings = Timings()
    try:
        async with adapter.serve() as base, aiohttp.ClientSession() as http:
            for s in range(cli.sessions + 1):  # session 0 warms up connections, template and tokenizer
                await session(cli, adapter, http, base, url, s, sent, timings)
    finally:
        EngineClient.generate = generate
    return timings


async def session(cli, adapter, http, base: str, url: str, s: int, sent: list, timings: Timings) -> None:
    """One conversation of `--turns` turns; a failed turn ends it (the next needs its reply)."""
    sid = f"bench-{s}"
    sampling = {"max_tokens": cli.max_tokens, "temperature": 1.0, "ignore_eos": True, "seed": s}
    adapter.open_session(sid, sampling_defaults=sampling)
    messages = [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": "Fix the failing test in pkg/; start by reading the code."}]
    for i in range(cli.initial_rounds):
        messages += tool_round(i)
    try:
        for t in range(cli.turns):
            timings.turns += 1
            try:
                reply, adapter_s, direct_s = await turn(http, base, url, sid, messages, sent)
            except TurnFailed as e:
                timings.fail(e)
                return
            if s > 0:
                timings.adapter.append(adapter_s)
                timings.direct.append(direct_s)
                timings.prompt_lengths.append(len(sent[-1][0]))
            messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""},
                         {"role": "user", "content": "Continue."}, *tool_round(100 + t)]
    finally:
        await adapter.finish_session(sid)


def report(cli: argparse.Namespace, timings: Timings) -> None:
    a, d, lengths = timings.adapter, timings.direct, timings.prompt_lengths
    print(f"adapter_overhead: {cli.sessions} sessions x {cli.turns} turns, {cli.max_tokens} sampled tokens/turn, "
          f"prompts {min(lengths)}-{max(lengths)} tokens (mean {statistics.mean(lengths):.0f})")
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        pa, pd = percentile(a, q) * 1000, percentile(d, q) * 1000
        print(f"  {name}: adapter {pa:8.2f} ms | direct vLLM {pd:8.2f} ms | "
              f"difference {pa - pd:+7.2f} ms | ratio {pa / pd:.3f}")
    per_turn = [x - y for x, y in zip(a, d)]
    print(f"  per-turn difference: median {statistics.median(per_turn) * 1000:+.2f} ms, "
          f"mean {statistics.mean(per_turn) * 1000:+.2f} ms")


async def main(cli: argparse.Namespace) -> int:
    configure_logging("console", "WARNING")
    server = None
    if cli.vllm_url is None:
        log_path = Path(tempfile.mkdtemp(prefix="vime-bench-")) / "vllm.log"
        server = VLLMServer(tiny_model_dir(), server_args=["--max-model-len", "8192", "--seed", "0",
                                                           "--no-enable-prefix-caching"], log_path=log_path)
        server.start().wait_healthy()
    try:
        timings = await run(cli, cli.vllm_url or server.url)
    finally:
        if server:
            server.stop()
    if timings.failed:
        print(f"adapter_overhead: FAILED: {timings.failed} of {timings.turns} turns failed; first error: "
              f"{timings.first_error}; no figures printed", file=sys.stderr)
        return 1
    report(cli, timings)
    return 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--initial-rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--vllm-url", default=None, help="use a running server instead of starting one")
    sys.exit(asyncio.run(main(p.parse_args())))
