"""A run's metrics where users look: `metrics.jsonl` and TensorBoard's event file (read back with
TensorBoard's own reader), eval figures at their rounds' steps, bookkeeping keys no scalars."""

from __future__ import annotations

import subprocess
import sys

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vime.metrics_log import TENSORBOARD_DIR, MetricsLog, read_metrics


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return {tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_eval_figures_reach_tensorboard_at_the_rounds_steps_and_bookkeeping_keys_do_not(tmp_path):
    log = MetricsLog(tmp_path)
    eval_round = {"eval/heldout/reward_mean": 0.25, "eval/heldout/pass@4": 0.5, "eval/heldout/failed": 1,
                  "eval/heldout/failed/timeout": 1, "eval_weight_version": 0}
    log.write(0, {"reward_mean": 0.2, "finished_at": 1.8e9, "weight_version": 1, **eval_round})
    log.write(1, {"reward_mean": 0.4, "finished_at": 1.8e9 + 5, "weight_version": 2})
    log.write(2, {"step": 2, "eval_only": True, "finished_at": 1.8e9 + 9, **eval_round,
                  "eval/heldout/reward_mean": 0.75, "eval_weight_version": 2})
    assert not log.write(1, {"reward_mean": 9.0}), "a step already written is not written again"

    found = scalars(tmp_path)
    assert found["eval/heldout/reward_mean"] == [(0, 0.25), (2, 0.75)]
    assert found["eval/heldout/failed/timeout"] == [(0, 1.0), (2, 1.0)]
    assert found["reward_mean"] == [(0, 0.2), (1, 0.4)]
    assert not {"step", "finished_at", "eval_only"} & set(found), sorted(found)
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2]
    assert read_metrics(tmp_path)[2]["finished_at"] == 1.8e9 + 9, "metrics.jsonl keeps every key"


def test_recording_metrics_imports_no_torch(tmp_path):
    """The rollout worker records metrics (a local activity): with or without TensorBoard it
    loads no torch (torch's SummaryWriter did, even when the tensorboard package was missing)."""
    code = ("import sys; from vime.metrics_log import MetricsLog; "
            f"MetricsLog({str(tmp_path)!r}).write(0, {{'reward_mean': 0.5}}); print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / TENSORBOARD_DIR).is_dir()
