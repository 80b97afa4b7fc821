"""The logprob gap of low-precision rollouts: a bfloat16 vLLM server against the float32 trainer.

    python bench/low_precision.py [--model DIR] [--dtypes float32,bfloat16] [--requests 16]
                                  [--max-tokens 32] [--temperature 1.0]

For each rollout dtype a vLLM server of `--model` (default: the tiny test model) is started and
samples `--requests` seeded responses; the trainer's logprob of every sampled token comes from a
float32 transformers forward pass (what `vime.train.trainer` computes on CPU). Printed per dtype,
side by side: mean and 99th-percentile |rollout - trainer| logprob, the mean signed gap (a bias),
and the share of tokens whose trainer/rollout probability ratio leaves [0.5, 2] (the band MIS
masks with its defaults; TIS clips the ratio at 2). float32 is the control. A failed request
fails the benchmark: one line, exit 1, no table.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.engine.client import EngineClient  # noqa: E402
from vime.engine.server import VLLMServer  # noqa: E402

PROMPTS = ["Write a capital letter:", "def add(a, b):", "The quick brown fox", "Count to five:"]


def trainer_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


async def sample_gaps(url: str, model, prompts: list[list[int]], requests: int, max_tokens: int,
                      temperature: float) -> torch.Tensor:
    gaps = []
    async with EngineClient(url) as client:
        for seed in range(requests):
            prompt = prompts[seed % len(prompts)]
            out = await client.generate(prompt, {"max_tokens": max_tokens, "temperature": temperature,
                                                 "seed": seed, "ignore_eos": True})
            gaps.append(torch.tensor(out.log_probs) - trainer_logprobs(model, prompt, out.token_ids, temperature))
    return torch.cat(gaps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the tiny test model)")
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--temperature", type=float, default=1.0)
    opts = parser.parse_args(argv)

    from transformers import AutoModelForCausalLM, AutoTokenizer

    from vime.testing.tiny_model import tiny_model_dir

    model_dir = opts.model or str(tiny_model_dir())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompts = [tokenizer.encode(p, add_special_tokens=False) for p in PROMPTS]
    logs = Path(tempfile.mkdtemp(prefix="precision-bench-"))
    rows = []
    for dtype in opts.dtypes.split(","):
        server = VLLMServer(model_dir, server_args=["--dtype", dtype, "--max-model-len", "1024"],
                            log_path=logs / f"vllm-{dtype}.log")
        try:
            with server:
                gaps = asyncio.run(sample_gaps(server.url, model, prompts, opts.requests, opts.max_tokens,
                                               opts.temperature))
        except Exception as exc:  # noqa: BLE001 - any failure: no table
            print(f"FAILED: {dtype}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__} "
                  f"(server log: {server.log_path})", file=sys.stderr)
            return 1
        ratio = torch.exp(-gaps)  # trainer / rollout probability
        outside = ((ratio < 0.5) | (ratio > 2.0)).float().mean().item()
        rows.append((dtype, gaps.numel(), gaps.abs().mean().item(), gaps.abs().quantile(0.99).item(),
                     gaps.mean().item(), outside))
    print(f"{'rollout dtype':<14} {'tokens':>6} {'mean|gap|':>10} {'p99|gap|':>9} {'mean gap':>9} {'ratio out of [0.5,2]':>20}")
    for dtype, n, mean_abs, p99, mean, outside in rows:
        print(f"{dtype:<14} {n:>6} {mean_abs:>10.2e} {p99:>9.2e} {mean:>9.1e} {outside:>20.2%}")
    print("(gap = rollout logprob - float32 trainer logprob, per sampled token)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
