"""The quickstart: the tiny model learns to write capital letters, through the whole stack.

    python -m examples.quickstart.run [vime flags that override the defaults below]

Temporal (embedded dev server), a vLLM CPU server, a rollout worker and an FSDP2 trainer, with
a weight sync after every step: the same path a GPU cluster takes, small enough for 2 cores.
Writes `reward_curve.png` and `summary.json` to the run directory and prints a one-line summary;
the workflow histories stay browsable (`temporal workflow list --address ...`, or the Web UI).
"""

from __future__ import annotations

import json
import shlex
import sys
import time
from pathlib import Path

from examples.quickstart.plot import plot_curve
from vime.errors import VimeError
from vime.log import configure_logging
from vime.config.preflight import checked_args
from vime.rollout.eval_metrics import round_sets
from vime.rundir import refuse_if_held

PROMPTS = ["Write a title.", "Name a city.", "Say something.", "Describe the sea.", "Give a command.",
           "Tell me a fact.", "Write a headline.", "Name a river."]
# held-out prompts: other requests, none of them a training prompt, so an eval round measures
# whether what the policy learned (capitals) carries over to prompts it never trained on
HELDOUT = ["Name a mountain.", "Write a slogan.", "Describe the sky.", "Give a warning.", "Tell me a rule.",
           "Name a song.", "Write a caption.", "Say a greeting."]
HELDOUT_FILE, HELDOUT_SAMPLES = "heldout.jsonl", "4"


def write_prompts(path: Path, count: int = 64, phrases: list[str] = PROMPTS) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"prompt": [{"role": "user", "content": f"{phrases[i % len(phrases)]} ({i})"}]}) + "\n")


def eval_flags(argv: list[str], run_dir: Path) -> list[str]:
    """With `--eval-interval N` and no eval set given: evaluate on the held-out prompts written
    beside the training prompts (set `heldout`, 4 samples per prompt unless given, for pass@4)."""
    if "--eval-interval" not in argv or "--eval-prompt-data" in argv:
        return []
    samples = [] if "--n-samples-per-eval-prompt" in argv else ["--n-samples-per-eval-prompt", HELDOUT_SAMPLES]
    return ["--eval-prompt-data", "heldout", str(run_dir / HELDOUT_FILE), *samples]


def default_flags(run_dir: Path, model: str) -> list[str]:
    return [
        "--hf-checkpoint", model, "--prompt-data", str(run_dir / "prompts.jsonl"), "--input-key", "prompt",
        "--apply-chat-template", "--rollout-shuffle",
        "--rollout-batch-size", "8", "--n-samples-per-prompt", "8", "--rollout-max-response-len", "16",
        "--rollout-temperature", "1.0", "--num-rollout", "24",
        "--custom-rm-path", "examples.quickstart.reward.capitals",
        "--advantage-estimator", "grpo", "--lr", "1e-2", "--adam-beta2", "0.99",
        "--run-dir", str(run_dir), "--save", str(run_dir / "checkpoints"), "--save-interval", "10",
        "--vllm-max-model-len", "512",
    ]


def pop_option(argv: list[str], flag: str, default: str, kind: type = str):
    """An example's own option (not a vime flag, e.g. `--sft-steps`): read and removed from `argv`,
    as `kind`. A missing or malformed value is one line on stderr and exit 2, before anything starts."""
    value = default
    if flag in argv:
        i = argv.index(flag)
        if i + 1 >= len(argv):
            print(f"error: {flag} needs a value", file=sys.stderr)
            raise SystemExit(2)
        value = argv[i + 1]
        del argv[i:i + 2]
    try:
        return kind(value)
    except ValueError:
        print(f"error: {flag} {value}: expected {'a whole number' if kind is int else kind.__name__}", file=sys.stderr)
        raise SystemExit(2) from None


def refuse_if_in_use(run_dir: Path, name: str) -> None:
    """Exit 2 with the run directory lock's one line when a live launch holds `run_dir`: an example
    writes its prompts (and more) there before `vime.launcher.launch` takes the lock, and must not rewrite
    the files of the run that is going on."""
    try:
        refuse_if_held(run_dir)
    except VimeError as e:
        print(f"{name}: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def prepare(argv: list[str], name: str) -> tuple[Path, str]:
    """The run directory (`--run-dir`, or a new `runs/<name>-<time>`) with the prompts written in
    it, and the model (`--hf-checkpoint`, or the tiny test model, built once and cached)."""
    run_dir = Path("runs") / time.strftime(f"{name}-%Y%m%d-%H%M%S")
    if "--run-dir" in argv:
        run_dir = Path(argv[argv.index("--run-dir") + 1])
    refuse_if_in_use(run_dir, name)
    model = argv[argv.index("--hf-checkpoint") + 1] if "--hf-checkpoint" in argv else None
    if model is None:
        from vime.testing.tiny_model import tiny_model_dir

        print(f"[{name}] building (or reusing) the tiny test model")
        model = str(tiny_model_dir())
    write_prompts(run_dir / "prompts.jsonl")
    write_prompts(run_dir / HELDOUT_FILE, count=len(HELDOUT), phrases=HELDOUT)
    return run_dir, model


def main(argv: list[str] | None = None) -> int:
    configure_logging(level="WARNING")
    argv = list(sys.argv[1:] if argv is None else argv)
    run_dir, model = prepare(argv, "quickstart")
    try:
        args = checked_args(default_flags(run_dir, model) + argv + eval_flags(argv, run_dir))
    except VimeError as e:
        print(f"quickstart: error: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    resume = shlex.join(["scripts/quickstart.sh", *argv, *([] if "--run-dir" in argv else ["--run-dir", str(run_dir)])])
    from vime.launcher.launch import run_to_end  # after the checks: torch, vLLM and Temporal load here

    code, state = run_to_end(args, resume, checked=True)
    if state is None:
        return code
    summarize("quickstart", Path(args.run_dir), state.metrics, time.monotonic() - t0)
    return 0


def every_step(run_dir: Path, kept: list[dict]) -> list[dict]:
    """Every step's metrics line, from `metrics.jsonl`: the run's state keeps the last 100 only
    (`kept`, used when the file has fewer lines, e.g. a run dir without it)."""
    from vime.metrics_log import read_metrics

    lines = read_metrics(run_dir)
    return lines if len(lines) >= len(kept) else kept


def summarize(name: str, run_dir: Path, metrics: list[dict], seconds: float, extra: str = "") -> None:
    """Plot the reward curve and print (and write to `summary.txt`) the run's one-line summary,
    with each eval set's reward at the first and the last round when the run evaluated. Over
    every step of `metrics.jsonl` when it has them all (`metrics`: what the run's state kept)."""
    metrics = every_step(run_dir, metrics)
    rewards = [m["reward_mean"] for m in metrics if not m.get("eval_only")]
    plot_curve(rewards, run_dir / "reward_curve.png", title=f"{name}: mean reward per step")
    first, last = rewards[0], sum(rewards[-3:]) / len(rewards[-3:])
    line = (f"{name}: mean reward {first:.2f} at step 1 -> {last:.2f} over the last 3 steps, {len(rewards)} steps"
            f"{extra}{eval_summary(metrics)}, this launch took {seconds:.0f} s; curve: {run_dir / 'reward_curve.png'}")
    (run_dir / "summary.txt").write_text(line + "\n")
    print(line)


def eval_summary(metrics: list[dict]) -> str:
    """`; eval heldout 0.21 at step 0 -> 0.93 at step 24` per eval set; "" without eval rounds."""
    parts = []
    for name in sorted({name for m in metrics for name in round_sets(m)}):
        key = f"eval/{name}/reward_mean"
        rounds = [m for m in metrics if isinstance(m.get(key), int | float)]
        if rounds:
            parts.append(f"; eval {name} {rounds[0][key]:.2f} at step {rounds[0]['step']} -> "
                         f"{rounds[-1][key]:.2f} at step {rounds[-1]['step']}")
    return "".join(parts)


if __name__ == "__main__":
    sys.exit(main())
