"""The coding-agent example end to end on CPU: SFT warm start, then RL through Temporal.

    python -m examples.coding_agent_rl.run [--tasks N] [--sft-steps N] [--preset rl-gain] [vime train flags that override the defaults]

See README.md in this directory. Writes everything to the run directory (default
`runs/coding-agent-<time>/`): `traces.jsonl`, `sft-model` (a link to the cached warm start), `prompts.jsonl`, the store, the
Temporal database, `summary.txt`; prints one line per RL step and, at the end, the rollouts
`temporal workflow list --query "RolloutStatus='completed'"` finds.

`--preset rl-gain` (rl_gain.py) runs 20 RL steps on every training task each step and
evaluates on training and held-out tasks inside the run (`--eval-interval`): what RL adds after
the warm start.
"""

from __future__ import annotations

import asyncio
import hashlib
import shlex
import subprocess
import sys
import time
from pathlib import Path

from examples.coding_agent_rl import rl_gain
from examples.coding_agent_rl.gold_edits import write_prompts
from examples.quickstart.run import pop_option, refuse_if_in_use
from examples.coding_agent_rl.sft_traces import write_traces
from examples.coding_agent_rl.tasks.prepare import load_tasks
from vime.config.args import parse_args
from vime.launcher.launch import run_to_end
from vime.log import configure_logging
from vime.temporal.dev_server import TemporalDevServer, temporal_cli_path
from vime.train.sft import load_sft_samples, run_sft

SFT_FLAGS = ["--lr", "3e-3", "--seed", "1"]


def rl_flags(run_dir: Path, model: Path, tasks: int) -> list[str]:
    return [
        "--hf-checkpoint", str(model), "--prompt-data", str(run_dir / "prompts.jsonl"), "--input-key", "prompt",
        "--label-key", "label", "--rollout-shuffle",
        "--rollout-env", "coding_agent", "--sandbox-backend", "bwrap",
        "--agent-max-turns", "4", "--agent-max-tokens", "160", "--agent-command-timeout", "30",
        "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "3",
        "--rollout-temperature", "1.0", "--advantage-estimator", "grpo", "--lr", "1e-4",
        "--run-dir", str(run_dir), "--vllm-max-model-len", "2048",
    ]


def sft(run_dir: Path, base_model: str, tasks, steps: int) -> Path:
    """Traces of every task, then `vime sft` on them; returns the warm-started model. The model is
    cached like the tiny model (`$VIME_CACHE`, keyed by the base model, the traces' bytes and the
    SFT settings): the same warm start again costs the traces only. `run_dir/sft-model` links to it."""
    from vime.testing.tiny_model import cached_build

    out = run_dir / "sft-model"
    if out.is_symlink() and not out.exists():  # the cache was cleared since
        out.unlink()
    if out.exists():
        return out
    traces = run_dir / "traces.jsonl"
    t0 = time.monotonic()
    n = asyncio.run(write_traces(base_model, traces, tasks))
    print(f"[coding-agent] {n} synthetic traces in {time.monotonic() - t0:.0f} s -> {traces}")

    def build(model: Path) -> None:
        args = parse_args(["--hf-checkpoint", base_model, "--sft-data", str(traces), "--save", str(model),
                           "--run-dir", str(model.parent / "sft"), "--global-batch-size", str(min(4, n)),
                           "--sft-num-steps", str(steps), *SFT_FLAGS])
        result = run_sft(args, load_sft_samples(traces))
        print(f"[coding-agent] SFT: loss {result.first_loss:.3f} -> {result.last_loss:.4f} in {result.steps} steps "
              f"({result.seconds:.0f} s)")

    params = {"base": str(Path(base_model).resolve()), "traces": hashlib.sha256(traces.read_bytes()).hexdigest(),
              "steps": steps, "batch": min(4, n), "flags": SFT_FLAGS}
    out.symlink_to(cached_build("coding-agent-sft", params, build))
    print(f"[coding-agent] warm start: {out} -> {out.resolve()}")
    return out


def list_rollouts(run_dir: Path, query: str) -> str:
    """`temporal workflow list --query ...` against the run's Temporal database (the run's dev
    server has stopped; a fresh one on the same file serves its histories)."""
    with TemporalDevServer(run_dir, headless=True) as server:
        proc = subprocess.run([str(temporal_cli_path()), "workflow", "list", "--address", server.address,
                               "--query", query, "--limit", "1000"], capture_output=True, text=True, timeout=60)
    return proc.stdout + proc.stderr


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    preset = pop_option(argv, "--preset", "")
    if preset not in ("", "rl-gain"):
        raise SystemExit(f"--preset {preset!r}: the presets are 'rl-gain' (or none, the fast default)")
    gain = preset == "rl-gain"
    count = pop_option(argv, "--tasks", str(rl_gain.TRAIN_TASKS) if gain else "4", int)
    sft_steps = pop_option(argv, "--sft-steps", str(rl_gain.SFT_STEPS) if gain else "120", int)
    run_dir = Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv else \
        Path("runs") / time.strftime("coding-agent-%Y%m%d-%H%M%S")
    refuse_if_in_use(run_dir, "coding-agent")
    run_dir.mkdir(parents=True, exist_ok=True)
    preset_flags = rl_gain.rl_flags(run_dir) if gain else []
    from vime.testing.tiny_model import tiny_model_dir

    tasks = load_tasks()
    model = sft(run_dir, str(tiny_model_dir()), tasks[:count], sft_steps)
    write_prompts(tasks[:count], run_dir / "prompts.jsonl")
    if gain:
        rl_gain.write_eval_sets(run_dir, tasks)
    args = parse_args(rl_flags(run_dir, model, count) + preset_flags + argv)
    t0 = time.monotonic()
    resume = shlex.join([sys.executable, "-m", "examples.coding_agent_rl.run", *sys.argv[1:],
                         *([] if "--run-dir" in sys.argv else ["--run-dir", str(run_dir)])])
    code, state = run_to_end(args, resume)
    if state is None:
        return code
    rewards = [m.get("reward_mean", 0.0) for m in state.metrics]
    line = (f"coding-agent: {len(rewards)} RL steps in {time.monotonic() - t0:.0f} s, mean reward per step "
            + " ".join(f"{r:.2f}" for r in rewards))
    (run_dir / "summary.txt").write_text(line + "\n")
    print(line)
    if gain:
        from vime.metrics_log import read_metrics

        rl_gain.report(run_dir, sft_steps, read_metrics(run_dir))
    else:
        print(list_rollouts(run_dir, "RolloutStatus='completed'"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
