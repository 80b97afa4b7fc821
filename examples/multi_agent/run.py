"""The multi-agent example: K solvers, a rewriter and a selector (one policy) learn the toy task
(answer in capitals, `task.py`), through the whole stack.

    python -m examples.multi_agent.run [vime flags that override the defaults below]

By default the rollouts are the durable environment (`--rollout-env multi_agent`: one workflow
per rollout, one activity per role); pass `--custom-generate-function-path
vime.envs.multi_agent.generate.generate` to run the same roles as a plain generate hook instead.
Writes `reward_curve.png` (per step: mean reward, the final answers' accuracy, each role's mean
score) and `summary.txt` to the run directory and prints the one-line summary.
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from examples.quickstart.plot import plot_curves
from examples.quickstart.run import refuse_if_in_use
from vime.config.args import parse_args
from vime.envs.multi_agent.task import ROLES
from vime.errors import VimeError
from vime.launcher.launch import run_to_end
from vime.log import configure_logging
from vime.store import SampleStore

PROBLEMS = ["Name a city.", "Write a title.", "Say something.", "Describe the sea.", "Give a command.",
            "Tell me a fact.", "Write a headline.", "Name a river."]
HOOK = "--custom-generate-function-path"


def write_prompts(path: Path, count: int = 64) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"prompt": f"{PROBLEMS[i % len(PROBLEMS)]} ({i})"}) + "\n")


def default_flags(run_dir: Path, model: str, argv: list[str]) -> list[str]:
    route = [] if HOOK in argv else ["--rollout-env", "multi_agent"]
    return [
        *route, "--hf-checkpoint", model, "--prompt-data", str(run_dir / "prompts.jsonl"), "--input-key", "prompt",
        "--rollout-shuffle", "--num-solvers", "3", "--correct-reward-weight", "1.2", "--incorrect-reward-weight", "0.8",
        "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--rollout-max-response-len", "16",
        "--rollout-temperature", "1.0", "--num-rollout", "20",
        "--advantage-estimator", "grpo", "--lr", "1e-2", "--adam-beta2", "0.99",
        "--run-dir", str(run_dir), "--save", str(run_dir / "checkpoints"), "--save-interval", "10",
        "--vllm-max-model-len", "512",
    ]


def prepare(argv: list[str]) -> tuple[Path, str]:
    run_dir = Path(argv[argv.index("--run-dir") + 1]) if "--run-dir" in argv else \
        Path("runs") / time.strftime("multi_agent-%Y%m%d-%H%M%S")
    refuse_if_in_use(run_dir, "multi_agent")
    model = argv[argv.index("--hf-checkpoint") + 1] if "--hf-checkpoint" in argv else None
    if model is None:
        from vime.testing.tiny_model import tiny_model_dir

        print("[multi_agent] building (or reusing) the tiny test model")
        model = str(tiny_model_dir())
    write_prompts(run_dir / "prompts.jsonl")
    return run_dir, model


def step_figures(run_dir: Path, run_id: str, steps: int) -> list[dict[str, float]]:
    """Per trained step, from the store: the mean reward (each rollout once), the share of rollouts
    whose final answer is correct, each role's mean score, and the fan-out sizes."""
    figures = []
    with SampleStore.open(run_dir) as store:
        for step in range(steps):
            samples = store.read_step_samples(run_id, step)
            rollouts: dict[str, list] = {}
            for s in samples:
                rollouts.setdefault(str(s.rollout_id), []).append(s)
            row = {"reward": sum(sum(x.reward for x in r) / len(r) for r in rollouts.values()) / len(rollouts),
                   "accuracy": sum(r[0].metadata["final_correct"] for r in rollouts.values()) / len(rollouts),
                   "samples": len(samples), "rollouts": len(rollouts)}
            for role in ROLES:
                scores = [s.metadata["score"] for s in samples if s.metadata["role"] == role]
                row[role] = sum(scores) / len(scores) if scores else 0.0
            figures.append(row)
    return figures


def summarize(run_dir: Path, run_id: str, steps: int, seconds: float) -> str:
    figures = step_figures(run_dir, run_id, steps)
    series = {"reward": [f["reward"] for f in figures], "final accuracy": [f["accuracy"] for f in figures],
              **{f"{role} score": [f[role] for f in figures] for role in ROLES}}
    plot_curves(series, run_dir / "reward_curve.png", title="multi_agent: per step (rewards x 0.8 or 1.2)")
    (run_dir / "figures.json").write_text(json.dumps(figures, indent=1))

    def mean(key: str, rows: list[dict]) -> float:
        return sum(r[key] for r in rows) / len(rows)

    last = figures[-3:]
    line = (f"multi_agent: mean reward {figures[0]['reward']:.2f} at step 1 -> {mean('reward', last):.2f} over the "
            f"last 3 steps; final accuracy {figures[0]['accuracy']:.2f} -> {mean('accuracy', last):.2f}; scores "
            + ", ".join(f"{r} {figures[0][r]:.2f} -> {mean(r, last):.2f}" for r in ROLES)
            + f"; {len(figures)} steps, {figures[-1]['samples']} samples of {figures[-1]['rollouts']} rollouts per "
            f"step, this launch took {seconds:.0f} s; curve: {run_dir / 'reward_curve.png'}")
    (run_dir / "summary.txt").write_text(line + "\n")
    return line


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    run_dir, model = prepare(argv)
    try:
        args = parse_args(default_flags(run_dir, model, argv) + argv)
    except VimeError as e:
        print(f"multi_agent: error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    resume = shlex.join([sys.executable, "-m", "examples.multi_agent.run", *argv,
                         *([] if "--run-dir" in argv else ["--run-dir", str(run_dir)])])
    code, state = run_to_end(args, resume)
    if state is None:
        return code
    print(summarize(Path(args.run_dir), args.run_id, len(state.metrics), time.monotonic() - t0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
