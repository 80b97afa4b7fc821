"""`--preset rl-gain`: what RL adds after the warm start, on training and held-out tasks.

    python -m examples.coding_agent_rl.run --preset rl-gain

The default run (a warm start that memorises the fixes, then 3 RL steps at lr 1e-4) shows no
gain. This preset runs `RL_STEPS` GRPO steps on the first `TRAIN_TASKS` tasks with every
task in every step (`--rollout-batch-size` = the task count, so each step's mean reward is the
training pass rate under the current policy) at a learning rate that does not collapse the
policy (2e-3 did, in one update: README), and evaluates inside the run: `--eval-interval
EVAL_EVERY` on two eval sets, the training tasks (`train`) and the next `HELDOUT_TASKS` tasks
that the warm start never showed (`heldout`). Each round is the run's durable eval round through
the coding agent (one eval rollout per task attempt, each from the round's one policy version,
stored once, never trained), at step 0 (the SFT model), every `EVAL_EVERY` steps and after the
last; its pass@k lands in `metrics.jsonl` as `eval/<set>/pass@k`. A checkpoint is saved at the
same steps, so `vime eval RUN_DIR --checkpoints all` evaluates them again later (other sets,
more samples).

Writes `rl_gain.json` (every number) and `rl_curve.png` to the run directory and prints the
curve. README.md reports what it measured here and why the held-out line stays at zero.
"""

from __future__ import annotations

import json
from pathlib import Path

from examples.coding_agent_rl.curve import plot_rl_curve
from examples.coding_agent_rl.gold_edits import write_prompts

TRAIN_TASKS = 4
HELDOUT_TASKS = 8
SFT_STEPS = 120
"""Measured here (README): 40 and 80 SFT steps leave every rollout failing (zero-variance groups,
no GRPO gradient); 120 (loss 0.006) passes 0.56-0.63 of the training rollouts at temperature 1."""
RL_STEPS = 20
EVAL_EVERY = 5
EVAL_N = 4
"""Attempts per task in an eval round (both sets: one `--n-samples-per-eval-prompt`): pass@1..4."""
EVAL_SETS = ("train", "heldout")


def eval_set_paths(run_dir: Path) -> dict[str, Path]:
    return {name: run_dir / f"eval-{name}.jsonl" for name in EVAL_SETS}


def write_eval_sets(run_dir: Path, tasks) -> dict[str, Path]:
    """The eval sets' prompt files: the training tasks, and the held-out ones after them."""
    paths = eval_set_paths(run_dir)
    write_prompts(tasks[:TRAIN_TASKS], paths["train"])
    write_prompts(tasks[TRAIN_TASKS:TRAIN_TASKS + HELDOUT_TASKS], paths["heldout"])
    return paths


def rl_flags(run_dir: Path) -> list[str]:
    """The preset's `vime train` flags, applied over the example's defaults (the user's flags
    still override them)."""
    sets = [str(x) for name, path in eval_set_paths(run_dir).items() for x in (name, path)]
    return ["--num-rollout", str(RL_STEPS), "--rollout-batch-size", str(TRAIN_TASKS),
            "--n-samples-per-prompt", "8", "--lr", "3e-4",
            "--save", str(run_dir / "ckpt"), "--save-interval", str(EVAL_EVERY),
            "--eval-interval", str(EVAL_EVERY), "--eval-prompt-data", *sets,
            "--n-samples-per-eval-prompt", str(EVAL_N)]


def eval_curves(metrics: list[dict]) -> dict[str, dict[int, float]]:
    """`{set: {step: pass@1}}` of the run's eval rounds (step 0: the SFT model)."""
    return {name: {m["step"]: m[f"eval/{name}/pass@1"] for m in metrics if f"eval/{name}/pass@1" in m}
            for name in EVAL_SETS}


def report(run_dir: Path, sft_steps: int, metrics: list[dict]) -> dict:
    """The run's curve from its metrics: the training reward per step and the eval rounds.

    `metrics` are the run's `metrics.jsonl` lines: each step's mean reward (its rollouts sampled
    with the weights before its update), how many of its groups had one reward for every sample
    (`adv_groups/degenerate`: GRPO's advantages, hence its gradient, are zero there), and the
    eval rounds' figures (`eval/<set>/...`; the round after the last step is a line of its own)."""
    steps = [m for m in metrics if not m.get("eval_only")]
    step_rewards = [m.get("reward_mean", 0.0) for m in steps]
    degenerate = [f"{m.get('adv_groups/degenerate', 0):.0f}/{m.get('adv_groups', 0):.0f}" for m in steps]
    print("[rl-gain] train reward per step " + " ".join(f"{r:.2f}" for r in step_rewards), flush=True)
    print("[rl-gain] zero-variance groups per step " + " ".join(degenerate), flush=True)
    rounds = [m for m in metrics if any(k.startswith("eval/") for k in m)]
    for m in rounds:
        for name in EVAL_SETS:
            print(f"[rl-gain] step {m['step']:2d} {name:7s} pass@1 {m.get(f'eval/{name}/pass@1', 0):.3f} "
                  f"pass@{EVAL_N} {m.get(f'eval/{name}/pass@{EVAL_N}', 0):.3f}", flush=True)
    curves = eval_curves(metrics)
    out = {
        "sft_steps": sft_steps, "train_reward_per_step": step_rewards, "degenerate_groups_per_step": degenerate,
        "eval": {str(m["step"]): {k: v for k, v in m.items() if k.startswith("eval")} for m in rounds},
    }
    (run_dir / "rl_gain.json").write_text(json.dumps(out, indent=2))
    series = {"train rollouts (reward per step)": {i: r for i, r in enumerate(step_rewards)},
              "train tasks, eval pass@1": curves["train"], "held-out tasks, eval pass@1": curves["heldout"]}
    plot_rl_curve(run_dir / "rl_curve.png", len(step_rewards), series,
                  title=f"coding agent: {TRAIN_TASKS} train tasks, {HELDOUT_TASKS} held out, SFT {sft_steps} steps")
    print(f"[rl-gain] curve: {run_dir / 'rl_curve.png'}; numbers: {run_dir / 'rl_gain.json'}")
    return out
