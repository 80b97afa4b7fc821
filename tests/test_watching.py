"""Watching a run, specified without servers: why a run waits, in one line (`vime.ops.waiting`);
`vime status --follow` printing a line per new step, each waiting reason once, and how the run
ended (`vime.ops.watch`, on a fake workflow handle); each run's state in `vime runs`; what a
restart really does (`vime.temporal.restart_plan`); and the trainer's per-step log line naming
its run. The same, on long-lived workers and real servers: tests/test_long_lived_workers.py."""

from __future__ import annotations

import asyncio
import dataclasses
from types import SimpleNamespace

import pytest
from structlog.contextvars import merge_contextvars
from structlog.testing import capture_logs
from temporalio.client import WorkflowExecutionStatus

from vime.ops import watch as watch_module
from vime.ops.queries import RunSummary
from vime.ops.run_states import run_state
from vime.ops.waiting import Pending, Snapshot, engine_urls_of, reason
from vime.ops.watch import Watch
from vime.temporal.restart_plan import Recorded, restart_plan
from vime.temporal.training_contract import TrainingState

BUSY = ("trainer host-1:vime-trainer-host-1-42 is training run 'exp-a'; run 'exp-b' waits for a free trainer "
        "(start another trainer worker to run both at once)")


# ---- why a run waits --------------------------------------------------------------------------

def test_a_run_waiting_for_a_trainer_names_the_run_that_holds_it():
    waits = Snapshot(pending=[Pending("pick_trainer", 7, BUSY, "TrainerBusy", "vime-trainer")])
    assert reason(waits) == ("waits for a free trainer: run exp-a holds trainer host-1:vime-trainer-host-1-42 "
                             "(until that run ends)")


def test_workers_down_and_an_engine_restarting_are_named_by_queue_and_url():
    down = Snapshot(pending=[Pending("train_step", 1, "", "", "vime-trainer-h-1")],
                    idle_queues=["vime-rollout", "vime-trainer-h-1"], engines_down=["http://10.0.0.5:8000"])
    assert reason(down) == ("workers down: no worker polls task queue 'vime-rollout', 'vime-trainer-h-1' (start the "
                            "workers, or the run's `vime train`); engine restarting: vLLM server http://10.0.0.5:8000 "
                            "does not answer /health")


def test_an_activity_failing_again_and_again_is_a_reason_and_a_first_attempt_or_nothing_pending_is_none():
    retrying = Snapshot(pending=[Pending("register_run", 3, "store locked\nTraceback ...", "ApplicationError")])
    assert reason(retrying) == "register_run retrying (attempt 3): store locked"
    assert reason(Snapshot(pending=[Pending("train_step")])) is None
    assert reason(Snapshot()) is None


def test_a_run_s_engines_come_from_its_recorded_flags():
    assert engine_urls_of(["--run-id", "a", "--vllm-server-urls", "http://h:1", "http://h:2", "--num-rollout", "2"]) \
        == ["http://h:1", "http://h:2"]
    assert engine_urls_of(["--vllm-router-ip", "10.0.0.5", "--vllm-router-port", "8000"]) == ["http://10.0.0.5:8000"]
    assert engine_urls_of(None) == []


# ---- `vime status --follow` ---------------------------------------------------------------------

def step(n: int) -> dict:
    return {"step": n, "reward_mean": 0.5, "response_length_mean": 4.0, "finished_at": 0.0}


class FakeHandle:
    """A training workflow that answers `describe` and `progress` from a script: one (status,
    progress) per poll, the last one kept; progress None: no worker answers the query."""

    def __init__(self, script: list[tuple[str, dict | None]], result=None) -> None:
        self.script, self.result_value, self.now = script, result, script[0]

    async def describe(self):
        self.now = self.script.pop(0) if self.script else self.now
        return SimpleNamespace(status=WorkflowExecutionStatus[self.now[0]], task_queue="vime-rollout")

    async def query(self, name, rpc_timeout=None):
        if self.now[1] is None:
            raise RuntimeError("no poller")
        return self.now[1]

    async def result(self):
        return self.result_value


def follow(handle: FakeHandle, idle: list[str | None], monkeypatch) -> tuple[int, list[str]]:
    """Run `Watch.follow` on `handle`; `idle`: the queue no worker polls at each poll, in turn."""
    lines: list[str] = []

    async def observe(client, described, urls):
        queue = idle.pop(0) if idle else None
        return Snapshot(idle_queues=[queue] if queue else [])

    monkeypatch.setattr(watch_module, "observe", observe)
    client = SimpleNamespace(get_workflow_handle=lambda workflow_id, result_type=None: handle)
    watch = Watch(client, "exp-w", lambda: "the same command starts it again from scratch", poll=0, out=lines.append)
    return asyncio.run(watch.follow()), lines


def test_follow_prints_each_new_step_once_each_reason_once_and_the_end(monkeypatch):
    progress = lambda *steps: {"num_rollout": 3, "metrics": [step(n) for n in steps], "notices": []}  # noqa: E731
    handle = FakeHandle([("RUNNING", progress(0)),  # step 1 was done before: not printed
                         ("RUNNING", None), ("RUNNING", None),  # no worker answers: the reason, once
                         ("RUNNING", progress(0, 1)), ("RUNNING", progress(0, 1)), ("COMPLETED", None)],
                        result=TrainingState(step=3, metrics=[step(0), step(1), step(2)]))
    code, lines = follow(handle, [None, "vime-rollout", "vime-rollout", None, None], monkeypatch)
    assert code == 0
    assert lines[0] == ("[wait] run exp-w: workers down: no worker polls task queue 'vime-rollout' (start the "
                        "workers, or the run's `vime train`)")
    assert [line.split(" | ")[0] for line in lines[1:3]] == ["[#############       ] step 2/3",
                                                             "[####################] step 3/3"]
    assert lines[3:] == ["[vime] run exp-w finished: 3 steps"]


def test_follow_of_a_cancelled_run_says_what_starting_it_again_does_and_exits_1(monkeypatch):
    code, lines = follow(FakeHandle([("CANCELED", None)]), [], monkeypatch)
    assert (code, lines) == (1, ["[vime] run exp-w was cancelled; its samples stay in the store; the same command "
                                 "starts it again from scratch"])


# ---- `vime runs`: each run's state ----------------------------------------------------------------

def summary(steps: int, *, finished: bool = False) -> RunSummary:
    return RunSummary("exp", "2026-12-03 10:00", 80, steps, 10, 0.5, 0, finished=finished)


@pytest.mark.parametrize(("workflow", "state"), [
    ("RUNNING", "running"), ("COMPLETED", "finished"), ("FAILED", "failed"), ("TIMED_OUT", "failed"),
    ("CANCELED", "cancelled"), ("TERMINATED", "cancelled")])
def test_a_run_s_state_is_its_workflow_s(workflow, state):
    assert run_state(summary(8), workflow) == state  # a cancelled run at step 8/10 is cancelled, not "step 8/10"


def test_without_a_temporal_to_ask_a_run_is_finished_failed_cancelled_or_stopped_from_the_store():
    assert run_state(summary(8), None) == "stopped"
    assert run_state(summary(10), None) == "finished"
    assert run_state(summary(3, finished=True), None) == "finished"  # its workflow recorded its end
    for ended in ("failed", "cancelled"):  # `vime train` recorded how its workflow ended
        assert run_state(dataclasses.replace(summary(8), ended=ended), None) == ended


def test_the_store_keeps_how_a_run_ended_until_the_run_is_started_again(tmp_path):
    """`vime train`'s Temporal stops with it, so the launcher records a cancel or a failure in the
    store; `vime runs` reads it back, and the run's next start (its workflow registers the run's
    flags) clears it."""
    from vime.ops.queries import run_summaries
    from vime.store import SampleStore

    with SampleStore.open(tmp_path / "run") as store:
        store.register_run("exp", ["--num-rollout", "10"], {"num_rollout": 10})
        store.record_ended("exp", "cancelled", "run exp was cancelled (vime cancel ...)")
        [listed] = run_summaries(store)
        assert (listed.ended, run_state(listed, None)) == ("cancelled", "cancelled")
        store.register_run("exp", ["--num-rollout", "10"], {"num_rollout": 10})
        [listed] = run_summaries(store)
        assert (listed.ended, run_state(listed, None)) == (None, "stopped")
        assert store.run_argv("exp") == ["--num-rollout", "10"]


# ---- what a restart does ---------------------------------------------------------------------------

def test_a_restart_without_save_retrains_the_recorded_steps_from_the_base_weights_not_a_checkpoint():
    line = restart_plan(Recorded(trained_steps=8, checkpoint_step=None))
    assert "from the base weights (no checkpoint: it ran without --save) and retrains the 8 steps recorded" in line
    assert "last checkpoint" not in line


def test_a_restart_with_a_checkpoint_retrains_only_the_steps_after_it_and_nothing_trained_is_from_scratch():
    assert restart_plan(Recorded(8, 5)).endswith("starts it again from its checkpoint after step 5, retrains the 3 "
                                                 "steps recorded after it on their stored rollouts, then samples on")
    assert restart_plan(Recorded(0, None)).endswith("starts it again from scratch (no step was trained)")
    assert "the base weights without --save" in restart_plan(None)  # no store to read: the rule


# ---- the trainer's log names the run ----------------------------------------------------------------

def test_the_trainer_logs_one_line_per_step_naming_the_run():
    from activities.train import TrainerActivities
    from workflows.trainer_calls import TrainInput

    group = SimpleNamespace(trainer=None, call=lambda name, run_id, step: {"reward_mean": 0.25, "samples": 8})
    with capture_logs(processors=[merge_contextvars]) as logs:
        asyncio.run(TrainerActivities(group, "q").train_step(TrainInput("exp-b", 3)))
    (done,) = [e for e in logs if e["event"] == "train_step.done"]
    assert (done["run_id"], done["step"], done["reward_mean"], done["samples"]) == ("exp-b", 3, 0.25, 8)
