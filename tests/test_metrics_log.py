"""A run's metrics where users look: `metrics.jsonl` and TensorBoard's event file (read back with
TensorBoard's own reader), tags grouped `train/`, `rollout/`, `eval/`, `perf/`, `sync/`, eval
figures at their rounds' steps, bookkeeping keys no scalars, and every line in each dashboard
exactly once, also when a launch died between the file and a dashboard and the run resumed."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from vime.metrics.tags import GROUPS, figures, tag
from vime.metrics_log import METRICS_FILE, TENSORBOARD_DIR, MetricsLog, read_metrics

# A real step's line (tests/data-like: the keys the trainer and the training workflow report).
STEP_LINE = {
    "loss": 0.1, "pg_loss": 0.1, "pg_clipfrac": 0.0, "ppo_kl": 0.0, "entropy": 2.5, "grad_norm": 0.3, "lr": 1e-4,
    "adv_advantages/mean": 0.0, "adv_infra_failures": 0.0, "optimizer_steps": 1,
    "reward_mean": 0.25, "response_length_mean": 8.0, "rollouts": 8, "samples": 8, "failed_samples": 0,
    "staleness_max": 1, "train_seconds": 0.8, "train_tokens_per_second": 118.9, "rollout_wait_seconds": 0.4,
    "train_phase_seconds": 0.9, "sync_seconds": 0.2, "sync_pause_seconds": 0.1, "sync_wire_bytes": 5381312,
    "weight_version": 1, "eval_seconds": 3.0, "eval_weight_version": 0, "eval/heldout/reward_mean": 0.5,
    "finished_at": 1.8e9, "step": 0, "eval_only": False, "eval_checkpoint": "step_0",
}


def scalars(run_dir) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(run_dir / TENSORBOARD_DIR))
    events.Reload()
    return {tag: [(e.step, pytest.approx(e.value)) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def test_each_key_of_a_step_line_has_its_group_and_bookkeeping_none():
    assert {k: tag(k) for k in STEP_LINE} == {
        "loss": "train/loss", "pg_loss": "train/pg_loss", "pg_clipfrac": "train/pg_clipfrac", "ppo_kl": "train/ppo_kl",
        "entropy": "train/entropy", "grad_norm": "train/grad_norm", "lr": "train/lr",
        "adv_advantages/mean": "train/adv_advantages/mean", "adv_infra_failures": "train/adv_infra_failures",
        "optimizer_steps": "train/optimizer_steps",
        "reward_mean": "rollout/reward_mean", "response_length_mean": "rollout/response_length_mean",
        "rollouts": "rollout/rollouts", "samples": "rollout/samples", "failed_samples": "rollout/failed_samples",
        "staleness_max": "rollout/staleness_max",
        "train_seconds": "perf/train_seconds", "train_tokens_per_second": "perf/train_tokens_per_second",
        "rollout_wait_seconds": "perf/rollout_wait_seconds", "train_phase_seconds": "perf/train_phase_seconds",
        "sync_seconds": "sync/seconds", "sync_pause_seconds": "sync/pause_seconds",
        "sync_wire_bytes": "sync/wire_bytes", "weight_version": "sync/weight_version",
        "eval_seconds": "eval/seconds", "eval_weight_version": "eval/weight_version",
        "eval/heldout/reward_mean": "eval/heldout/reward_mean",
        "finished_at": None, "step": None, "eval_only": None, "eval_checkpoint": None,
    }
    assert {name.split("/")[0] for name in figures(STEP_LINE)} == set(GROUPS)
    assert figures({"loss": float("nan"), "done": True, "label": "x"}) == {}, "no NaN, booleans or strings"


def test_eval_figures_reach_tensorboard_at_the_rounds_steps_and_bookkeeping_keys_do_not(tmp_path):
    log = MetricsLog(tmp_path)
    eval_round = {"eval/heldout/reward_mean": 0.25, "eval/heldout/pass@4": 0.5, "eval/heldout/failed": 1,
                  "eval/heldout/failed/timeout": 1, "eval_weight_version": 0}
    log.write(0, {"reward_mean": 0.2, "finished_at": 1.8e9, "weight_version": 1, **eval_round})
    log.write(1, {"reward_mean": 0.4, "finished_at": 1.8e9 + 5, "weight_version": 2})
    log.write(2, {"step": 2, "eval_only": True, "finished_at": 1.8e9 + 9, **eval_round,
                  "eval/heldout/reward_mean": 0.75, "eval_weight_version": 2})
    assert not log.write(1, {"reward_mean": 9.0}), "a step already written is not written again"
    log.flush()  # TensorBoard gets the lines on a thread of its own

    found = scalars(tmp_path)
    assert found["eval/heldout/reward_mean"] == [(0, 0.25), (2, 0.75)]
    assert found["eval/heldout/failed/timeout"] == [(0, 1.0), (2, 1.0)]
    assert found["eval/weight_version"] == [(0, 0.0), (2, 2.0)]
    assert found["rollout/reward_mean"] == [(0, 0.2), (1, 0.4)]
    assert found["sync/weight_version"] == [(0, 1.0), (1, 2.0)]
    assert {name.split("/")[0] for name in found} <= set(GROUPS), sorted(found)
    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2]
    assert read_metrics(tmp_path)[2]["finished_at"] == 1.8e9 + 9, "metrics.jsonl keeps every key"


class Unreachable:
    """A dashboard that is down: every write fails."""

    def written(self, step: int) -> bool:
        return False

    def write(self, step, metrics) -> None:
        raise ConnectionError("dashboard down")

    def close(self) -> None:
        pass


def test_a_resumed_run_gives_tensorboard_each_line_once_including_those_a_dead_launch_missed(tmp_path):
    """Launch 1 writes steps 0-1, then dies after step 2 reached the file but not TensorBoard (here:
    a line appended by hand). A failing dashboard costs nothing but a log line. Launch 2 (a new
    log on the same directory, as a relaunched worker opens it) is asked for steps 1-3 again, as a
    replayed workflow asks: the file and TensorBoard each end with 0, 1, 2, 3 once."""
    first = MetricsLog(tmp_path)
    for step in (0, 1):
        assert first.write(step, {**STEP_LINE, "loss": step / 10})
    first.close()
    with open(tmp_path / METRICS_FILE, "a") as f:
        f.write('{"loss": 0.2, "step": 2}\n')
    down = MetricsLog(tmp_path / "other", [Unreachable()])
    assert down.write(0, {"loss": 1.0}), "the file has it all the same"
    down.close()

    second = MetricsLog(tmp_path)
    assert [second.write(step, {**STEP_LINE, "loss": step / 10}) for step in (1, 2, 3)] == [False, False, True]
    second.close()
    assert not second.write(3, STEP_LINE) and second.write(4, STEP_LINE), "a closed log opens again"
    second.close()

    assert [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2, 3, 4]
    assert (tmp_path / METRICS_FILE).read_text().count("\n") == 5
    assert scalars(tmp_path)["train/loss"] == [(0, 0.0), (1, 0.1), (2, 0.2), (3, 0.3), (4, 0.1)]
    assert len(list((tmp_path / TENSORBOARD_DIR).iterdir())) == 3, "one event file per opening"


class Hung:
    """A dashboard whose writes hang until released (W&B's servers unreachable)."""

    def __init__(self) -> None:
        self.release, self.got = threading.Event(), []

    def written(self, step: int) -> bool:
        return False

    def write(self, step, metrics) -> None:
        self.release.wait(30)
        self.got.append(step)

    def close(self) -> None:
        pass


def test_a_hung_dashboard_holds_up_no_step(tmp_path):
    """The training workflow waits for each step's line: the file gets it at once, the dashboard
    gets it in order on its own thread when it answers again."""
    hung = Hung()
    log = MetricsLog(tmp_path, [hung])
    started = time.monotonic()
    assert [log.write(step, {"loss": 0.5}) for step in (0, 1, 2)] == [True, True, True]
    assert time.monotonic() - started < 5 and [m["step"] for m in read_metrics(tmp_path)] == [0, 1, 2]
    hung.release.set()
    log.close()
    assert hung.got == [0, 1, 2]


def test_recording_metrics_imports_no_torch(tmp_path):
    """The rollout worker records metrics (a local activity): with or without TensorBoard it
    loads no torch (torch's SummaryWriter did, even when the tensorboard package was missing)."""
    code = ("import sys; from vime.metrics_log import MetricsLog; "
            f"log = MetricsLog({str(tmp_path)!r}); log.write(0, {{'reward_mean': 0.5}}); log.close(); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
    assert (tmp_path / TENSORBOARD_DIR).is_dir()
