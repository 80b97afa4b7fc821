"""examples/coding_agent_rl --preset rl-gain, without running it (a run takes ~30 min on CPU):
its flags parse over the example's defaults and evaluate inside the run (`--eval-interval` on
the training and the held-out tasks, through the coding agent), and its report draws the curve
from the run's metrics."""

from __future__ import annotations

import json

from examples.coding_agent_rl import rl_gain
from examples.coding_agent_rl.curve import plot_rl_curve
from examples.coding_agent_rl.run import rl_flags
from examples.coding_agent_rl.tasks.prepare import load_tasks
from vime.config.args import parse_args
from vime.rollout.eval_data import eval_sets


def test_rl_gain_flags_parse_over_the_example_defaults_and_evaluate_in_the_run(tmp_path):
    paths = rl_gain.write_eval_sets(tmp_path, load_tasks())
    args = parse_args(rl_flags(tmp_path, tmp_path / "sft-model", rl_gain.TRAIN_TASKS) + rl_gain.rl_flags(tmp_path))
    assert args.num_rollout == rl_gain.RL_STEPS <= 20
    assert args.rollout_batch_size == rl_gain.TRAIN_TASKS  # every training task in every step
    assert args.save_interval == args.eval_interval == rl_gain.EVAL_EVERY and args.save == str(tmp_path / "ckpt")
    assert args.rollout_env == "coding_agent" and args.sandbox_backend == "bwrap"
    assert args.n_samples_per_eval_prompt == rl_gain.EVAL_N
    assert eval_sets(args) == [("train", str(paths["train"])), ("heldout", str(paths["heldout"]))]
    held = [json.loads(line)["label"] for line in paths["heldout"].read_text().splitlines()]
    train = [json.loads(line)["label"] for line in paths["train"].read_text().splitlines()]
    assert len(held) == rl_gain.HELDOUT_TASKS and len(train) == rl_gain.TRAIN_TASKS and not set(held) & set(train)


def test_the_report_draws_the_train_reward_and_the_eval_rounds_from_the_metrics(tmp_path):
    metrics = [{"step": 0, "reward_mean": 0.5, "eval/train/pass@1": 0.5, "eval/heldout/pass@1": 0.0},
               {"step": 1, "reward_mean": 0.25},
               {"step": 2, "eval_only": True, "eval/train/pass@1": 0.75, "eval/heldout/pass@1": 0.0}]
    out = rl_gain.report(tmp_path, 120, metrics)
    assert out["train_reward_per_step"] == [0.5, 0.25]  # the round after the last step is no step
    assert rl_gain.eval_curves(metrics) == {"train": {0: 0.5, 2: 0.75}, "heldout": {0: 0.0, 2: 0.0}}
    assert sorted(out["eval"]) == ["0", "2"] and (tmp_path / "rl_curve.png").stat().st_size > 0
    assert json.loads((tmp_path / "rl_gain.json").read_text())["eval"]["2"]["eval/train/pass@1"] == 0.75


def test_curve_is_written(tmp_path):
    path = plot_rl_curve(tmp_path / "c.png", 4, {"a": {0: 0.1, 1: 0.5, 4: 0.9}, "b": {0: 0.0, 4: 0.0}}, title="t")
    assert path.stat().st_size > 0
