"""Acting at once on a worker the launcher saw die.

Temporal notices a dead worker only when its activities miss their heartbeat timeout (60 s by
default) and its workflows' sticky task queue times out. The launcher knows sooner: it watched
the process exit. `recover_from_worker_death` then tells Temporal directly:

- every activity of the run that the dead process had started is failed with a retryable
  `WorkerLost` error (by workflow id and activity id, matched on the worker's identity), so it
  is retried at once on the restarted worker — the training workflow treats a `WorkerLost`
  trainer activity like a lost trainer and re-attaches;
- every running workflow of the run has its sticky task queue reset, so its next workflow task
  goes to any live worker instead of waiting for the dead one's sticky queue to time out.

The same goes for a new launch of a run whose previous launcher died or was stopped: the
activities its workers had started are failed at once (`recover_from_earlier_launch`).

Best effort: whatever this misses still recovers through the heartbeat timeouts.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Callable

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from vime.log import get_logger
from vime.temporal.training_contract import WORKER_LOST  # the type the training workflow reads as "trainer lost"

log = get_logger(__name__)


async def recover_from_worker_death(client: Client, run_id: str, identity: str, reason: str) -> int:
    """Fail the activities `identity` was running in run `run_id`; returns how many were failed."""
    return await _fail_started(client, run_id, lambda who: who == identity, reason)


async def recover_from_earlier_launch(client: Client, run_id: str, launch: str, reason: str) -> int:
    """Fail the activities of run `run_id` that workers of an earlier `vime train` on this host had
    started: the new launch holds the run directory, so those workers are dead (killed with their
    launcher, or stopped by Ctrl-C before they could hand their work back)."""
    mine = re.compile(rf"^\w+-[0-9a-f]+-\d+@{re.escape(socket.gethostname())}$")
    return await _fail_started(client, run_id, lambda who: bool(mine.match(who)) and f"-{launch}-" not in who,
                               reason)


async def _fail_started(client: Client, run_id: str, lost: Callable[[str], bool], reason: str) -> int:
    failed = 0
    query = f"VimeRunId = '{run_id}' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        try:
            description = await handle.describe()
        except Exception:  # noqa: BLE001 - it finished meanwhile
            continue
        for pending in description.raw_description.pending_activities:
            if (not lost(pending.last_worker_identity)
                    or pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED):
                continue
            activity = client.get_async_activity_handle(workflow_id=execution.id, run_id=execution.run_id,
                                                        activity_id=pending.activity_id)
            with contextlib.suppress(Exception):  # completed or timed out meanwhile
                await activity.fail(ApplicationError(reason, type=WORKER_LOST))
                failed += 1
        with contextlib.suppress(Exception):
            await client.workflow_service.reset_sticky_task_queue(ResetStickyTaskQueueRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=execution.id, run_id=execution.run_id)))
    log.info("recovery.worker_lost", reason=reason, failed_activities=failed)
    return failed
