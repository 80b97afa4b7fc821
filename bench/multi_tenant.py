"""N LoRA runs at once on one fleet against the same N runs one after another, full fine-tuning,
each starting its own stack (issue #26 item 6).

    .venv/bin/python bench/multi_tenant.py [--runs 4] [--steps 6] [--out DIR]

Both sides train the tiny test model on the quickstart's task (its chat prompts, the `capitals`
reward, 16 new tokens), 4 prompts x 4 samples a step, `--steps` steps, lr 1e-2, as a user runs it:

- **fleet**: `vime fleet` started once (its "fleet ready" time is reported apart), then the N runs
  launched at the same moment with `vime train --fleet DIR --lora-rank 8`: one vLLM server and one
  trainer hold the base model once; each run trains its own adapter and syncs only it;
- **one after another**: N `vime train` launches, full fine-tuning, each starting its own Temporal,
  vLLM server and workers, the next after the last one ended.

Printed: each side's total wall time (the fleet's with and without its own start), per run its
launch → first step, its steps per minute (between its first and last step ends) and its sync
(bytes moved per step and the step's sync seconds, the trainer's pause for rollouts included),
then the ratios. A run that failed, or whose metrics miss a step, fails the bench: no table, exit 1.

LoRA on the tiny model learns far less per step than full fine-tuning (its embeddings, tied to the
LM head, are frozen and the final norm bounds the hidden state: docs/lora.md), so this compares
the cost of steps, not what they learn.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.fast_start import Launch, launch, running_fleet  # noqa: E402


@dataclass
class RunFigures:
    name: str
    wall: float
    first_step: float
    steps_per_minute: float
    sync_bytes: float
    sync_seconds: float


def task_flags(root: Path, run: str, steps: int) -> list[str]:
    from examples.quickstart.run import write_prompts

    prompts = root / "prompts.jsonl"
    if not prompts.exists():
        write_prompts(prompts, count=32)
    return ["--run-id", run, "--run-dir", str(root / run), "--prompt-data", str(prompts), "--input-key", "prompt",
            "--apply-chat-template", "--custom-rm-path", "examples.quickstart.reward.capitals",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16",
            "--rollout-temperature", "1.0", "--num-rollout", str(steps), "--lr", "1e-2", "--adam-beta2", "0.99"]


def timed(cmd: list[str], run_dir: Path) -> tuple[Launch, float]:
    t0 = time.monotonic()
    out = launch(run_dir, cmd)
    return out, time.monotonic() - t0


def figures(name: str, out: Launch, wall: float, run_dir: Path, steps: int) -> RunFigures:
    """The run's figures from its console and `metrics.jsonl`; SystemExit when it failed."""
    metrics_path = run_dir / "metrics.jsonl"
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines()] if metrics_path.exists() else []
    if out.returncode != 0 or "first_step" not in out.stages or sorted(m["step"] for m in metrics) != list(range(steps)):
        raise SystemExit(f"multi_tenant: run {name} failed (exit {out.returncode}, steps recorded "
                         f"{sorted(m['step'] for m in metrics)}); its last lines:\n" + "\n".join(out.tail))
    ends = sorted(m["finished_at"] for m in metrics)
    per_minute = 60 * (len(ends) - 1) / (ends[-1] - ends[0]) if len(ends) > 1 else float("nan")
    moved = [m.get("sync_wire_bytes", m.get("sync_full_bytes", m.get("sync_total", 0))) for m in metrics]
    return RunFigures(name, wall, out.stages["first_step"], per_minute, statistics.median(moved),
                      statistics.median(m["sync_seconds"] for m in metrics))


def fleet_side(root: Path, runs: int, steps: int, model: Path) -> tuple[float, float, list[RunFigures], float]:
    """(fleet start s, wall of the runs s, their figures, full weights' bytes)."""
    with running_fleet(root, model) as (fleet_dir, started):
        names = [f"fleet-{i}" for i in range(runs)]
        cmds = {n: [sys.executable, "-u", "-m", "vime.cli", "train", "--fleet", str(fleet_dir), "--lora-rank", "8",
                    *task_flags(root, n, steps)] for n in names}
        t1 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(runs) as pool:
            done = {n: pool.submit(timed, cmds[n], root / n) for n in names}
            results = {n: f.result() for n, f in done.items()}
        wall = time.monotonic() - t1
    figs = [figures(n, *results[n], root / n, steps) for n in names]
    full = json.loads((root / names[0] / "metrics.jsonl").read_text().splitlines()[0])["sync_full_bytes"]
    return started, wall, figs, float(full)


def sequential_side(root: Path, runs: int, steps: int, model: Path) -> tuple[float, list[RunFigures]]:
    figs = []
    t0 = time.monotonic()
    for i in range(runs):
        name = f"alone-{i}"
        cmd = [sys.executable, "-u", "-m", "vime.cli", "train", "--hf-checkpoint", str(model),
               "--vllm-max-model-len", "512", *task_flags(root, name, steps)]
        figs.append(figures(name, *timed(cmd, root / name), root / name, steps))
    return time.monotonic() - t0, figs


def table(figs: list[RunFigures]) -> list[str]:
    rows = ["| run | wall s | launch → first step s | steps/min | sync bytes/step | sync s/step |",
            "|---|---|---|---|---|---|"]
    rows += [f"| {f.name} | {f.wall:.1f} | {f.first_step:.1f} | {f.steps_per_minute:.1f} | {f.sync_bytes:,.0f} | "
             f"{f.sync_seconds:.2f} |" for f in figs]
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--out", help="where the runs' directories go (default: a temporary one)")
    args = parser.parse_args(argv)
    from vime.testing.tiny_model import tiny_model_dir

    model = tiny_model_dir()
    root = Path(args.out or tempfile.mkdtemp(prefix="vime-multi-tenant-"))
    root.mkdir(parents=True, exist_ok=True)
    load0 = os.getloadavg()[0]
    started, fleet_wall, fleet_figs, full_bytes = fleet_side(root, args.runs, args.steps, model)
    seq_wall, seq_figs = sequential_side(root, args.runs, args.steps, model)
    print(f"load average {load0:.2f} at the start, {os.getloadavg()[0]:.2f} at the end; {args.runs} runs x "
          f"{args.steps} steps of 4 prompts x 4 samples")
    print(f"\nfleet: {args.runs} LoRA runs at once on one vLLM server and one trainer (fleet start {started:.1f} s)")
    print("\n".join(table(fleet_figs)))
    print(f"\none after another: {args.runs} full fine-tunes, each its own stack")
    print("\n".join(table(seq_figs)))
    med = statistics.median
    print(f"\ntotal wall: fleet {fleet_wall:.1f} s ({fleet_wall + started:.1f} s with its start) vs one after "
          f"another {seq_wall:.1f} s: {seq_wall / (fleet_wall + started):.2f}x faster with the start, "
          f"{seq_wall / fleet_wall:.2f}x on a warm fleet")
    print(f"launch → first step (median): fleet {med(f.first_step for f in fleet_figs):.1f} s vs own stack "
          f"{med(f.first_step for f in seq_figs):.1f} s (goal on a warm fleet ≤ 10 s)")
    print(f"steps/min per run (median): fleet {med(f.steps_per_minute for f in fleet_figs):.1f} (with "
          f"{args.runs - 1} other runs on the same server and trainer) vs alone "
          f"{med(f.steps_per_minute for f in seq_figs):.1f}")
    print(f"steps/min of the whole fleet: {sum(f.steps_per_minute for f in fleet_figs):.1f} vs one run alone "
          f"{med(f.steps_per_minute for f in seq_figs):.1f}")
    print(f"sync per step (median): adapter {med(f.sync_bytes for f in fleet_figs):,.0f} bytes, "
          f"{med(f.sync_seconds for f in fleet_figs):.2f} s (waiting its turn on the shared trainer included) vs "
          f"full weights {med(f.sync_bytes for f in seq_figs):,.0f} bytes moved ({full_bytes:,.0f} bytes of "
          f"parameters), {med(f.sync_seconds for f in seq_figs):.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
