"""The train phase against a plain PyTorch loop: the same model, batch and loss on one rank.

    python bench/train_phase.py [--repeats 10] [--groups 8] [--n 8] [--threads N] [--with-fsdp2]

Issue #25 item 3 asks the trainer's step to cost at most 1.5x a plain loop. Both sides train the
tiny test model (`vime.testing.tiny_model`, or `--model`) on one batch of the quickstart's shape
(`--groups` prompts x `--n` samples: ~40 prompt tokens, 4-16 response tokens, rewards of 0 or 1),
in turns, `--repeats` times after one warm-up turn each:

- vime: `Trainer.train_step`, as the trainer worker runs it (the quickstart's flags: GRPO,
  AdamW at lr 1e-2 and beta2 0.99, one optimizer step, gradient clip 1.0, packed rows);
- plain: a loop a reader writes from scratch: one padded batch, forward, the response tokens'
  log-probs, GRPO advantages, the PPO-clip loss at ratio 1 (each sample's token mean, then the
  mean), backward, `clip_grad_norm_`, AdamW;
- with `--with-fsdp2`, also the trainer under the FSDP2 wrapper at world size 1 (what vime ran
  before it left the wrapper off on one rank).

It prints each side's median seconds and vime / plain against the 1.5x goal (the goal missed is
a figure, not a failure: the host's load moves it). A side that raises or gives a loss that is
not finite fails the benchmark: one line, exit 1, no ratio. Figures: docs/performance.md.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from vime.types import Sample  # noqa: E402

GOAL = 1.5
LR, BETAS, CLIP = 1e-2, (0.9, 0.99), 1.0  # the quickstart's (examples/quickstart/run.py), and --clip-grad's default


def make_batch(groups: int, n: int, vocab: int, seed: int = 0) -> list[Sample]:
    """`groups` x `n` samples shaped like the quickstart's: a ~40-token prompt, up to 16 response tokens."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for group in range(groups):
        prompt = torch.randint(3, vocab, (int(torch.randint(34, 46, (1,), generator=g)),), generator=g).tolist()
        for i in range(n):
            s = Sample(group_index=group, index=group * n + i, rollout_id=f"{group}-{i}", tokens=list(prompt))
            k = int(torch.randint(4, 17, (1,), generator=g))
            s.append_response_tokens(torch.randint(3, vocab, (k,), generator=g).tolist(),
                                     (-torch.rand(k, generator=g) * 5).tolist())
            s.reward = float(torch.rand(1, generator=g) > 0.5)
            out.append(s)
    return out


def vime_step(model: str, run_dir: str, *, shard: bool | None) -> Callable[[list[Sample]], float]:
    from vime.config.args import parse_args
    from vime.train.trainer import Trainer

    args = parse_args(["--hf-checkpoint", model, "--run-dir", run_dir, "--rollout-batch-size", "8",
                       "--n-samples-per-prompt", "8", "--rollout-temperature", "1.0", "--advantage-estimator", "grpo",
                       "--lr", str(LR), "--adam-beta1", str(BETAS[0]), "--adam-beta2", str(BETAS[1]),
                       "--clip-grad", str(CLIP)])
    trainer = Trainer(args, shard=shard)
    return lambda samples: trainer.train_step(samples).metrics["loss"]


def plain_step(model_path: str) -> Callable[[list[Sample]], float]:
    """A plain loop over the same model and loss: what vime's step is measured against."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="sdpa")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=BETAS, weight_decay=0.0)

    def step(samples: list[Sample]) -> float:
        width = max(len(s.tokens) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        attention = torch.zeros(len(samples), width, dtype=torch.long)
        response = torch.zeros(len(samples), width - 1)
        for row, s in enumerate(samples):
            ids[row, :len(s.tokens)] = torch.tensor(s.tokens)
            attention[row, :len(s.tokens)] = 1
            response[row, s.prompt_length - 1:len(s.tokens) - 1] = 1  # the positions that predict the response
        groups = len({s.group_index for s in samples})
        rewards = torch.tensor([s.reward for s in samples]).view(groups, -1)  # the batch is group by group
        advantages = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-6)).view(-1, 1)

        logits = model(input_ids=ids, attention_mask=attention, use_cache=False).logits[:, :-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
        ratio = torch.exp(logp - logp.detach())
        per_token = torch.maximum(-advantages * ratio, -advantages * ratio.clamp(0.8, 1.2))
        loss = ((per_token * response).sum(1) / response.sum(1)).mean()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step


def timed(step: Callable[[list[Sample]], float], samples: list[Sample]) -> float:
    t0 = time.perf_counter()
    loss = step(samples)
    seconds = time.perf_counter() - t0
    if not math.isfinite(loss):
        raise RuntimeError(f"the loss is {loss}")
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="model directory (default: the tiny test model)")
    parser.add_argument("--repeats", type=int, default=10, help="timed turns per side, after one warm-up turn")
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--n", type=int, default=8, help="samples per group")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's, as the trainer)")
    parser.add_argument("--with-fsdp2", action="store_true", help="also time the trainer under the FSDP2 wrapper")
    opts = parser.parse_args(argv)
    if opts.threads:
        torch.set_num_threads(opts.threads)
    load = os.getloadavg()

    sides: dict[str, Callable[[list[Sample]], float]] = {}
    current = "loading the model"
    try:
        from transformers import AutoConfig

        from vime.testing.tiny_model import tiny_model_dir

        model = str(opts.model or tiny_model_dir())
        vocab = AutoConfig.from_pretrained(model).vocab_size
        samples = make_batch(opts.groups, opts.n, vocab)
        with tempfile.TemporaryDirectory() as run_dir:
            current = "vime"
            sides["vime"] = vime_step(model, run_dir, shard=None)
            if opts.with_fsdp2:
                current = "vime, FSDP2 at world size 1"
                sides[current] = vime_step(model, run_dir, shard=True)
            current = "plain"
            sides["plain"] = plain_step(model)
            seconds: dict[str, list[float]] = {name: [] for name in sides}
            for turn in range(opts.repeats + 1):
                for current, step in sides.items():
                    took = timed(step, samples)
                    if turn:
                        seconds[current].append(took)
    except Exception as e:  # noqa: BLE001 - a failure of either side fails the benchmark, in one line
        print(f"train_phase: FAILED ({current}): {type(e).__name__}: {e}", file=sys.stderr)
        return 1

    tokens = sum(len(s.tokens) for s in samples)
    print(f"train phase: {len(samples)} samples ({opts.groups} groups x {opts.n}), {tokens} tokens, "
          f"torch threads {torch.get_num_threads()}, {opts.repeats} turns each after a warm-up, "
          f"load average {load[0]:.2f} at the start, {os.getloadavg()[0]:.2f} at the end")
    medians = {name: statistics.median(s) for name, s in seconds.items()}
    for name, s in seconds.items():
        print(f"  {name:<30} median {medians[name]:.3f} s  (min {min(s):.3f}, max {max(s):.3f})")
    for name in (n for n in medians if n != "plain"):
        ratio = medians[name] / medians["plain"]
        verdict = "met" if ratio <= GOAL else "missed"
        print(f"ratio ({name} / plain): {ratio:.2f}x (goal <= {GOAL}x: {verdict})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
