"""Each run's state for `vime runs`: running, finished, failed or cancelled.

The store knows only whether a run finished (its workflow recorded its end) and how many steps
it trained: a run cancelled at step 8 of 10 looks there like one still going. Its workflow in
Temporal knows how it ended, so `vime runs` asks the Temporal a run lives in (its live launch's,
from `<run-dir>/launch.json`, or `--temporal-address`), and falls back to the store when there is
none to ask: "finished", "failed" or "cancelled" as recorded (`vime train` records how its
workflow ended before its own Temporal stops), else "stopped" (Ctrl-C, SIGTERM, a killed launcher).
"""

from __future__ import annotations

from temporalio.service import RPCError, RPCStatusCode

from vime.errors import ServiceError
from vime.ops.queries import RunSummary
from vime.temporal.client import connect

WORKFLOW_STATES = {"RUNNING": "running", "COMPLETED": "finished", "FAILED": "failed", "TIMED_OUT": "failed",
                   "CANCELED": "cancelled", "TERMINATED": "cancelled", "CONTINUED_AS_NEW": "running"}
CONNECT_TIMEOUT_S = 3.0


def run_state(summary: RunSummary, workflow_status: str | None) -> str:
    """`workflow_status`: the name of `train-<run>`'s status in Temporal, None when none was asked
    or it has no such workflow."""
    if workflow_status is not None:
        return WORKFLOW_STATES.get(workflow_status, workflow_status.lower())
    if summary.progress == "finished":
        return "finished"
    return summary.ended or "stopped"


async def workflow_statuses(address: str, namespace: str, run_ids: list[str]) -> dict[str, str]:
    """Each run's `train-<run>` status name in the Temporal at `address`: runs it does not know, and
    every run when it cannot be reached, are left out."""
    try:
        client = await connect(address, namespace, timeout=CONNECT_TIMEOUT_S)
    except ServiceError:
        return {}
    found = {}
    for run_id in run_ids:
        try:
            found[run_id] = (await client.get_workflow_handle(f"train-{run_id}").describe()).status.name
        except RPCError as e:
            if e.status != RPCStatusCode.NOT_FOUND:
                return found
    return found
