"""`--preset rl-gain`: what RL adds after the warm start, on training and held-out tasks.

    python -m examples.coding_agent_rl.run --preset rl-gain

The default run (a warm start that memorises the fixes, then 3 RL steps at lr 1e-4) shows no
gain. This preset runs `RL_STEPS` GRPO steps on the first `TRAIN_TASKS` tasks with every
task in every step (`--rollout-batch-size` = the task count, so each step's mean reward is the
training pass rate under the current policy) at a learning rate that does not collapse the
policy (2e-3 did, in one update: README), saves a checkpoint every `EVAL_EVERY` steps, and
afterwards evaluates the SFT model and each checkpoint on the training tasks and on the next
`HELDOUT_TASKS` tasks that the warm start never showed (`evaluate.py`). The Temporal training
loop does not run `--eval-interval` itself, hence the evaluation after the run.

Writes `rl_gain.json` (every number) and `rl_curve.png` to the run directory and prints the
curve. README.md reports what it measured here and why the held-out line stays at zero.
"""

from __future__ import annotations

import json
from pathlib import Path

from examples.coding_agent_rl.curve import plot_rl_curve
from examples.coding_agent_rl.evaluate import EvalResult, describe, evaluate
from examples.coding_agent_rl.gold_edits import write_prompts
from vime.envs.coding_agent.flags import coding_flags

TRAIN_TASKS = 4
HELDOUT_TASKS = 8
SFT_STEPS = 120
"""Measured here (README): 40 and 80 SFT steps leave every rollout failing (zero-variance groups,
no GRPO gradient); 120 (loss 0.006) passes 0.56-0.63 of the training rollouts at temperature 1."""
RL_STEPS = 20
EVAL_EVERY = 5
EVAL_N_TRAIN = 8
EVAL_N_HELDOUT = 4


def rl_flags(run_dir: Path) -> list[str]:
    """The preset's `vime train` flags, applied over the example's defaults (the user's flags
    still override them)."""
    return ["--num-rollout", str(RL_STEPS), "--rollout-batch-size", str(TRAIN_TASKS),
            "--n-samples-per-prompt", "8", "--lr", "3e-4",
            "--save", str(run_dir / "ckpt"), "--save-interval", str(EVAL_EVERY)]


def agent_flags(args) -> list[str]:
    """The run's agent and sampling flags, so an eval attempt is a training rollout without the update."""
    agent = coding_flags(args)
    return ["--rollout-env", "coding_agent", "--sandbox-backend", args.sandbox_backend,
            "--agent-max-turns", str(agent.agent_max_turns), "--agent-max-tokens", str(agent.agent_max_tokens),
            "--agent-command-timeout", str(agent.agent_command_timeout),
            "--rollout-temperature", str(args.rollout_temperature)]


def checkpoints(run_dir: Path, sft_model: Path, save: str | None) -> dict[int, Path]:
    """Step -> model: 0 is the SFT model, then every saved `step_N` (N = RL steps trained)."""
    found = {0: sft_model}
    for path in sorted(Path(save or run_dir / "ckpt").glob("step_*")):
        if (path / "state.json").exists():
            found[int(path.name.removeprefix("step_"))] = path
    return found


def report(run_dir: Path, args, tasks, sft_model: Path, sft_steps: int, metrics: list[dict]) -> dict:
    """Evaluate every checkpoint on the training and held-out tasks; write and print the curve.

    `metrics` are the run's per-step metrics: each step's mean reward (its rollouts sampled
    with the weights before its update) and how many of its groups had one reward for every
    sample (`adv_groups/degenerate`: GRPO's advantages, hence its gradient, are zero there)."""
    step_rewards = [m.get("reward_mean", 0.0) for m in metrics]
    degenerate = [f"{m.get('adv_groups/degenerate', 0):.0f}/{m.get('adv_groups', 0):.0f}" for m in metrics]
    print("[rl-gain] train reward per step " + " ".join(f"{r:.2f}" for r in step_rewards), flush=True)
    print("[rl-gain] zero-variance groups per step " + " ".join(degenerate), flush=True)
    sets = {"train": write_prompts(tasks[:TRAIN_TASKS], run_dir / "eval-train.jsonl"),
            "heldout": write_prompts(tasks[TRAIN_TASKS:TRAIN_TASKS + HELDOUT_TASKS], run_dir / "eval-heldout.jsonl")}
    flags = agent_flags(args)
    evals: dict[int, dict[str, EvalResult]] = {}
    for step, model in checkpoints(run_dir, sft_model, args.save).items():
        evals[step] = evaluate(model, sets, flags, n={"train": EVAL_N_TRAIN, "heldout": EVAL_N_HELDOUT},
                               log_path=run_dir / f"eval-vllm-{step}.log")
        for name, result in evals[step].items():
            print(f"[rl-gain] step {step:2d} {name:7s} {describe(result)}", flush=True)
    out = {
        "sft_steps": sft_steps, "train_reward_per_step": step_rewards, "degenerate_groups_per_step": degenerate,
        "eval": {str(s): {n: {"pass_rate": r.pass_rate, "per_task": r.per_task(), "outcomes": r.outcomes}
                          for n, r in e.items()} for s, e in evals.items()},
    }
    (run_dir / "rl_gain.json").write_text(json.dumps(out, indent=2))
    series = {"train rollouts (reward per step)": {i: r for i, r in enumerate(step_rewards)},
              "train tasks, eval": {s: e["train"].pass_rate for s, e in evals.items()},
              "held-out tasks, eval": {s: e["heldout"].pass_rate for s, e in evals.items()}}
    plot_rl_curve(run_dir / "rl_curve.png", len(step_rewards), series,
                  title=f"coding agent: {TRAIN_TASKS} train tasks, {HELDOUT_TASKS} held out, SFT {sft_steps} steps")
    print(f"[rl-gain] curve: {run_dir / 'rl_curve.png'}; numbers: {run_dir / 'rl_gain.json'}")
    return out

