"""Long runs: the training workflow continues as new with rollouts prefetched in flight, and what
travels through Temporal does not grow with the batch size.

A run of 7 steps with `--max-staleness 1` continues as new every 2 steps: four generations, each
handing the step it prefetched to the next through the store's step manifests. Every step still
trains exactly its samples, once, and the trainer's input is `(run, step)` whatever the batch.
"""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType
from tests.conftest import engine_flags
from tests.runs import TrainRun
from vime.temporal.client import connect
from vime.temporal.dev_server import TemporalDevServer

pytestmark = pytest.mark.vllm


async def histories(run: TrainRun) -> list:
    """Every execution of the run's training workflow, oldest first, read from its Temporal file."""
    server = TemporalDevServer(run.run_dir, headless=True)
    server.start()
    try:
        client = await connect(server.address, timeout=60)  # waits out "Frontend is not healthy yet"
        executions = [e async for e in client.list_workflows(f"WorkflowId = 'train-{run.run_id}'")]
        found = []
        for e in sorted(executions, key=lambda e: e.start_time):
            found.append(await client.get_workflow_handle(e.id, run_id=e.run_id).fetch_history())
        return found
    finally:
        server.stop()


def scheduled_inputs(history, activity: str) -> list[bytes]:
    out = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            if attrs.activity_type.name == activity:
                out.append(b"".join(p.data for p in attrs.input.payloads))
    return out


def completed_results(history, activity: str) -> list:
    types = {}
    out = []
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            types[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
        elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            if types.get(attrs.scheduled_event_id) == activity:
                out.append(json.loads(attrs.result.payloads[0].data))
    return out


async def test_a_run_continues_as_new_three_times_with_a_prefetched_step_in_flight(training_server, tiny_model_dir,
                                                                                  tmp_path):
    run = TrainRun(tmp_path, tiny_model_dir, *engine_flags(training_server), "--max-staleness", "1",
                   "--continue-as-new-after-steps", "2", "--save-interval", "7", steps=7, groups=2, n=4)
    try:
        assert run.run_to_end(900) == 0, run.tail()
        run.assert_trained_exactly_once()
        generations = await histories(run)
        assert len(generations) == 4  # steps 0-1, 2-3, 4-5, 6
        for history in generations[:-1]:
            last = history.events[-1]
            assert last.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW
            state = json.loads(last.workflow_execution_continued_as_new_event_attributes.input.payloads[0].data)
            assert "replay" not in state["state"] and len(json.dumps(state)) < 20_000
        # each later generation finds the step its predecessor prefetched already recorded, and
        # records (samples) only the steps after it
        for k, history in enumerate(generations[1:], start=1):
            assert [r["step"] for r in completed_results(history, "recorded_steps")[0]] == [2 * k]
            recorded = sorted(json.loads(p)["step"] for p in scheduled_inputs(history, "record_step"))
            assert recorded == list(range(2 * k + 1, min(run.steps, 2 * k + 3)))
        # no checkpoint before the end, yet the trainer, holding the run across generations, replays nothing
        for k, history in enumerate(generations):
            trained = sorted(json.loads(p)["step"] for p in scheduled_inputs(history, "train_step"))
            assert trained == list(range(2 * k, min(run.steps, 2 * k + 2)))
        for history in generations:
            for payload in scheduled_inputs(history, "train_step"):
                assert json.loads(payload) == {"run_id": run.run_id, "step": json.loads(payload)["step"]}
        run.assert_nothing_left()
    finally:
        run.kill_all()
