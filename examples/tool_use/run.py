"""The tool-use example end to end on CPU: SFT warm start, then GRPO through Temporal.

    python -m examples.tool_use.run [--sft-steps N] [--traces N] [vime train flags that override the defaults]

See README.md here. Everything goes to the run directory (default `runs/tool-use-<time>/`):
`sft-model` (a link to the cached warm start), `prompts.jsonl` (held-out problems: none is a trace's), the store,
the Temporal database, `reward_curve.png` and `summary.txt`. Prints one line per RL step.
"""

from __future__ import annotations

import asyncio
import shlex
import sys
import time
from pathlib import Path

from examples.quickstart.plot import plot_curves
from examples.quickstart.run import pop_option, refuse_if_in_use, summarize
from examples.tool_use.sft_traces import write_traces
from vime.config.args import parse_args
from vime.envs.tool_use.task import problems, write_prompts
from vime.errors import VimeError
from vime.launcher.launch import run_to_end
from vime.log import configure_logging
from vime.train.sft import load_sft_samples, run_sft

TRACE_SEED, PROMPT_SEED = 1, 2
SFT_BUILD = 2  # bump when the traces' format or the task changes: the cached warm start is rebuilt


def rl_flags(run_dir: Path, model: Path) -> list[str]:
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(run_dir / "prompts.jsonl"), "--input-key", "prompt",
        "--label-key", "label", "--apply-chat-template", "--rollout-shuffle",
        "--rollout-env", "tool_use", "--tool-max-turns", "2", "--tool-timeout", "5",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--num-rollout", "30",
        "--rollout-max-response-len", "48", "--rollout-temperature", "1.0",
        "--advantage-estimator", "grpo", "--lr", "3e-4", "--lr-warmup-iters", "3", "--adam-beta2", "0.99",
        "--run-dir", str(run_dir), "--vllm-max-model-len", "256",
        # A rollout lasts seconds, and 64 of them start at once: on the SQLite dev server an
        # activity start is now and then lost under that burst ("context deadline exceeded" in
        # temporal.log), and only the heartbeat timeout finds it. 20 s instead of 60 bounds the stall.
        "--heartbeat-timeout", "20",
    ]


SFT_LR, SFT_BATCH, SFT_SEED = 3e-3, 16, 1
DECLINE_SHARE = 0.3  # of the traces, declined without the tool (sft_traces.py): RL learns that the tool pays


def sft(run_dir: Path, base_model: str, traces: int, steps: int) -> Path:
    """The warm-started model: gold traces, then `vime sft` on them. Cached like the tiny model
    (`$VIME_CACHE`, keyed by the base model and every setting of the build), so a second run, or
    the test, skips the minutes of SFT; `run_dir/sft-model` links to it."""
    from vime.testing.tiny_model import cached_build

    def build(out: Path) -> None:
        work = out.parent
        path = work / "traces.jsonl"
        t0 = time.monotonic()
        n = asyncio.run(write_traces(base_model, path, problems(traces, TRACE_SEED), decline_share=DECLINE_SHARE))
        print(f"[tool-use] {n} traces ({DECLINE_SHARE:.0%} declined; the others' code run in the sandbox) "
              f"in {time.monotonic() - t0:.0f} s")
        args = parse_args(["--hf-checkpoint", base_model, "--sft-data", str(path), "--save", str(out),
                           "--run-dir", str(work / "sft"), "--global-batch-size", str(SFT_BATCH),
                           "--sft-num-steps", str(steps), "--lr", str(SFT_LR), "--seed", str(SFT_SEED)])
        result = run_sft(args, load_sft_samples(path))
        print(f"[tool-use] SFT: loss {result.first_loss:.3f} -> {result.last_loss:.4f} in {result.steps} steps "
              f"({result.seconds:.0f} s)")

    out = run_dir / "sft-model"
    if out.is_symlink() and not out.exists():  # the cache was cleared since
        out.unlink()
    if not out.exists():
        params = {"base": str(Path(base_model).resolve()), "traces": traces, "steps": steps, "lr": SFT_LR,
                  "batch": SFT_BATCH, "seed": SFT_SEED, "trace_seed": TRACE_SEED, "build": SFT_BUILD,
                  "decline_share": DECLINE_SHARE}
        out.symlink_to(cached_build("tool-use-sft", params, build))
    print(f"[tool-use] warm start: {out} -> {out.resolve()}")
    return out


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    sft_steps = pop_option(argv, "--sft-steps", "450", int)
    traces = pop_option(argv, "--traces", "1024", int)
    run_dir = Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv else \
        Path("runs") / time.strftime("tool-use-%Y%m%d-%H%M%S")
    refuse_if_in_use(run_dir, "tool-use")
    run_dir.mkdir(parents=True, exist_ok=True)
    from vime.testing.tiny_model import tiny_model_dir

    model = sft(run_dir, str(tiny_model_dir()), traces, sft_steps)
    seen = set(problems(traces, TRACE_SEED))
    write_prompts(run_dir / "prompts.jsonl", [p for p in problems(320, PROMPT_SEED) if p not in seen][:256])
    try:
        args = parse_args(rl_flags(run_dir, model) + argv)
    except VimeError as e:
        print(f"tool-use: error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    resume = shlex.join([sys.executable, "-m", "examples.tool_use.run", *sys.argv[1:],
                         *([] if "--run-dir" in sys.argv else ["--run-dir", str(run_dir)])])
    code, state = run_to_end(args, resume)
    if state is None:
        return code
    rewards = " ".join(f"{m['reward_mean']:.2f}" for m in state.metrics)
    run_dir = Path(args.run_dir)
    tool = tool_use_per_step(run_dir)
    summarize("tool-use", run_dir, state.metrics, time.monotonic() - t0,
              extra=f" (per step: {rewards}; share of rollouts using the tool: {' '.join(f'{t:.2f}' for t in tool)})")
    plot_curves({"mean reward": [m["reward_mean"] for m in state.metrics], "uses the tool": tool},
                run_dir / "tool_use_curve.png", title="tool-use: reward and tool use per RL step", y_max=1.0)
    return 0


def tool_use_per_step(run_dir: Path) -> list[float]:
    """The share of each step's rollouts that ran code (the decision RL learns here), by the
    policy version that sampled them."""
    from collections import defaultdict

    from vime.store import SampleStore

    used: dict[int, list[bool]] = defaultdict(list)
    with SampleStore.open(run_dir) as store:
        for _, s in store.iter_samples(run_dir.name):
            used[int(s.metadata.get("weight_version", 0))].append(bool(s.metadata.get("tool_calls")))
    return [sum(u) / len(u) for _, u in sorted(used.items())]


if __name__ == "__main__":
    sys.exit(main())
