"""examples/coding_agent_rl --preset rl-gain, without running it (a run takes ~30 min on CPU):
its flags parse over the example's defaults, it finds the checkpoints it evaluates, and it
draws its curve."""

from __future__ import annotations

import json

from examples.coding_agent_rl import rl_gain
from examples.coding_agent_rl.curve import plot_rl_curve
from examples.coding_agent_rl.run import rl_flags
from vime.config.args import parse_args


def test_rl_gain_flags_parse_over_the_example_defaults(tmp_path):
    args = parse_args(rl_flags(tmp_path, tmp_path / "sft-model", rl_gain.TRAIN_TASKS) + rl_gain.rl_flags(tmp_path))
    assert args.num_rollout == rl_gain.RL_STEPS <= 20
    assert args.rollout_batch_size == rl_gain.TRAIN_TASKS  # every training task in every step
    assert args.save_interval == rl_gain.EVAL_EVERY and args.save == str(tmp_path / "ckpt")
    assert rl_gain.agent_flags(args)[:4] == ["--rollout-env", "coding_agent", "--sandbox-backend", "bwrap"]


def test_checkpoints_are_the_sft_model_then_every_complete_saved_step(tmp_path):
    for step, complete in ((5, True), (10, True), (15, False)):
        d = tmp_path / "ckpt" / f"step_{step:06d}"
        d.mkdir(parents=True)
        if complete:
            (d / "state.json").write_text(json.dumps({"step": step}))
    found = rl_gain.checkpoints(tmp_path, tmp_path / "sft-model", None)
    assert list(found) == [0, 5, 10] and found[0] == tmp_path / "sft-model"


def test_curve_is_written(tmp_path):
    path = plot_rl_curve(tmp_path / "c.png", 4, {"a": {0: 0.1, 1: 0.5, 4: 0.9}, "b": {0: 0.0, 4: 0.0}}, title="t")
    assert path.stat().st_size > 0
