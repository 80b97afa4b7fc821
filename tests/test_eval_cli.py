"""`vime eval`'s command line, its table, the eval run's id, the eval curves of `vime report` and
the eval rounds' cost in `vime train`'s closing line: fast, no service started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vime.errors import ConfigError
from vime.launcher.eval_command import parse_eval_command, run_checkpoints, split_argv, without_flags
from vime.launcher.eval_launch import eval_table
from vime.launcher.launch import eval_cost, eval_cost_text
from vime.ops.report import RunData, eval_curves, render_html
from vime.testing.tiny_model import tiny_model_dir


def test_the_run_directory_and_checkpoints_are_split_from_the_vime_flags():
    assert split_argv(["runs/a", "--checkpoints", "1,2", "--eval-prompt-data", "h", "h.jsonl"]) == (
        "runs/a", "1,2", ["--eval-prompt-data", "h", "h.jsonl"])
    assert split_argv(["--hf-checkpoint", "m", "--checkpoints=last"][:2]) == (None, None, ["--hf-checkpoint", "m"])
    with pytest.raises(ConfigError, match="give its directory first"):
        split_argv(["--hf-checkpoint", "m", "--checkpoints", "last"])
    stored = ["--hf-checkpoint", "m", "--run-id", "r", "--vllm-server-urls", "u1", "u2", "--lr", "1", "--run-dir=x"]
    assert without_flags(stored, {"--run-id": 1, "--vllm-server-urls": None, "--run-dir": 1}) == [
        "--hf-checkpoint", "m", "--lr", "1"]


def _checkpoint(root: Path, step: int) -> None:
    path = root / f"step_{step:06d}"
    path.mkdir(parents=True)
    (path / "state.json").write_text(json.dumps({"step": step, "weight_version": step, "data_position": 0}))


class _Args:
    save = None


def test_checkpoints_are_chosen_all_last_or_by_step(tmp_path):
    args = _Args()
    args.save = str(tmp_path / "ckpt")
    for step in (2, 4, 6):
        _checkpoint(tmp_path / "ckpt", step)
    (tmp_path / "ckpt" / "step_000008.tmp").mkdir()  # a save cut short: not a checkpoint
    run = tmp_path / "run"
    run.mkdir()
    assert [c.step for c in run_checkpoints(args, run, "all")] == [2, 4, 6]
    assert [(c.label, c.weight_version) for c in run_checkpoints(args, run, "last")] == [("step_000006", 6)]
    assert [c.step for c in run_checkpoints(args, run, "6,2")] == [2, 6]
    with pytest.raises(ConfigError, match="no checkpoint at step 3; the run has steps 2, 4, 6"):
        run_checkpoints(args, run, "3")
    args.save = str(tmp_path / "none")
    with pytest.raises(ConfigError, match="no checkpoint found"):
        run_checkpoints(args, run, "all")


def test_the_eval_run_id_is_the_same_for_the_same_command_and_new_for_another(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "h.jsonl").write_text(json.dumps({"prompt": "say 1", "label": "1"}) + "\n")
    model = str(tiny_model_dir())
    argv = ["--hf-checkpoint", model, "--eval-prompt-data", "heldout", "h.jsonl", "--input-key", "prompt",
            "--rm-type", "exact_match"]
    first, again = parse_eval_command(argv), parse_eval_command(argv)
    assert first.args.run_id == again.args.run_id and "-eval-" in first.args.run_id
    assert Path(first.args.run_dir) == tmp_path / "runs" / first.args.run_id
    assert first.checkpoints[0].step == 0 and first.checkpoints[0].path is None  # the servers boot on it
    other = parse_eval_command([*argv, "--n-samples-per-eval-prompt", "4"])
    assert other.args.run_id != first.args.run_id
    with pytest.raises(ConfigError, match="needs --eval-prompt-data"):
        parse_eval_command(["--hf-checkpoint", model])
    with pytest.raises(ConfigError, match="no vime store"):
        parse_eval_command([str(tmp_path), "--eval-prompt-data", "heldout", "h.jsonl"])


ROUND = {"eval/heldout/reward_mean": 0.5, "eval/heldout/pass@1": 0.5, "eval/heldout/pass@4": 0.75,
         "eval/heldout/samples": 8, "eval/heldout/failed": 0, "eval/heldout/response_length_mean": 3.0,
         "eval_seconds": 2.0}


def test_the_table_has_a_row_per_checkpoint_and_set():
    table = eval_table([{"step": 1, "eval_checkpoint": "step_000001", **ROUND},
                        {"step": 2, "eval_checkpoint": "step_000002", **ROUND, "eval/other/samples": 2,
                         "eval/other/reward_mean": 1.0}]).splitlines()
    assert table[0].split() == ["checkpoint", "step", "set", "reward", "pass@1", "pass@k", "len", "samples", "failed"]
    assert table[1].split() == ["step_000001", "1", "heldout", "0.500", "0.500", "0.750", "(k=4)", "3.0", "8", "0"]
    assert [r.split()[:3] for r in table[2:]] == [["step_000002", "2", "heldout"], ["step_000002", "2", "other"]]
    failing = eval_table([{"step": 3, **ROUND, "eval/heldout/failed": 3, "eval/heldout/failed/infra": 2,
                           "eval/heldout/failed/timeout": 1}]).splitlines()
    assert failing[1].endswith("8        3 (infra 2, timeout 1)"), "the failed column names the classes"


def test_report_draws_eval_curves_beside_the_train_reward_and_the_closing_line_prices_the_rounds():
    metrics = [{"step": 0, "reward_mean": 0.1, "rollout_wait_seconds": 3.0, "train_phase_seconds": 4.0,
                "sync_seconds": 1.0, **ROUND},
               {"step": 1, "reward_mean": 0.3, "rollout_wait_seconds": 3.0, "train_phase_seconds": 4.0,
                "sync_seconds": 1.0},
               {"step": 2, "eval_only": True, **ROUND, "eval/heldout/reward_mean": 0.7}]
    assert len(RunData("r", {}, metrics).trained) == 2  # the report's step count: the round after the last is not a step
    svg = eval_curves(metrics)
    assert "Eval reward beside train reward" in svg
    assert all(name in svg for name in ("train reward", "eval heldout", "eval heldout pass@4"))
    assert eval_curves([{"step": 0, "reward_mean": 0.1}]) == ""
    page = render_html(RunData("r", {}, metrics))
    assert "Eval failures by class" in page and "No failed eval sample in 2 round(s)." in page
    metrics[2].update({"eval/heldout/failed": 2, "eval/heldout/failed/reward_error": 2})
    page = render_html(RunData("r", {}, metrics))
    assert "<tr><td>2</td><td>heldout</td><td>reward_error</td><td>2</td></tr>" in page
    assert "Eval failures" not in render_html(RunData("r", {}, metrics[1:2])), "no eval round: no section"
    cost = eval_cost(metrics)
    assert cost == {"eval_rounds": 2, "eval_seconds": 4.0, "step_seconds": 16.0}
    assert eval_cost_text(cost) == "eval 4.0 s in 2 round(s) beside 16.0 s of steps (+25%)"
    assert eval_cost([{"step": 0, "reward_mean": 0.1}]) is None
    metrics[1]["sync_held"] = True  # fully async: step 1 trained while the round sampled
    assert eval_cost_text(eval_cost(metrics)) == ("eval 4.0 s in 2 round(s) beside 16.0 s of steps, 1 step(s) "
                                                  "trained while a round sampled")


def test_an_hf_checkpoints_eval_config_decodes_without_training_sizes(tmp_path, monkeypatch):
    """An eval of an HF checkpoint has no --num-rollout or --rollout-batch-size: its workflow
    input still decodes (a None there failed every activation of the EvalWorkflow)."""
    from temporalio.converter import DataConverter

    from vime.launcher.eval_launch import eval_config
    from vime.temporal.eval_contract import EvalRunInput

    monkeypatch.chdir(tmp_path)
    (tmp_path / "h.jsonl").write_text(json.dumps({"prompt": "say 1", "label": "1"}) + "\n")
    cmd = parse_eval_command(["--hf-checkpoint", str(tiny_model_dir()), "--eval-prompt-data", "heldout", "h.jsonl",
                              "--input-key", "prompt"])
    inp = EvalRunInput(eval_config(cmd.args, 1), cmd.checkpoints)
    converter = DataConverter.default.payload_converter
    back = converter.from_payloads(converter.to_payloads([inp]), [EvalRunInput])[0]
    assert back == inp and back.config.num_rollout == 1
