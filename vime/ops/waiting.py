"""Why a run waits, in one line, for `vime status` and `vime status --follow`.

A run's `progress` query says only its phase ("attach" while it waits for a trainer), and nothing
when no worker is there to answer it. Temporal and the servers know the rest:

- the run's pending `pick_trainer` retrying with `TrainerBusy`: another run holds the trainer
  (its message names that run: `activities/train.py`), until that run ends or its lease runs out;
- a task queue the run needs (its workflow's, a pending activity's) with no poller: the workers
  that serve it are down, or were never started;
- a vLLM server of the run that does not answer `/health`: the engine is (re)starting;
- any other pending activity on its second attempt or later, with its last failure.

`Snapshot` is what was seen, `reason` the line (pure: tested without servers), `observe` looks.
"""

from __future__ import annotations

import asyncio
import re
from itertools import takewhile
from dataclasses import dataclass, field

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionDescription

from vime.engine.health import wait_until_healthy

PICK_TRAINER = "pick_trainer"  # workflows/trainer_calls.py's names: ops sits below workflows/
TRAINER_BUSY = "TrainerBusy"
HOLDER = re.compile(r"trainer (\S+) is training run '([^']+)'")


@dataclass
class Pending:
    """One of the run's pending activities, as `temporal workflow describe` lists it."""

    activity: str
    attempt: int = 1
    failure: str = ""  # the last attempt's failure message ("" before any failed)
    failure_type: str = ""  # its application error type (TrainerBusy, WorkerLost, ...)
    queue: str = ""  # the task queue it is scheduled on ("" when the server does not say)


@dataclass
class Snapshot:
    pending: list[Pending] = field(default_factory=list)
    idle_queues: list[str] = field(default_factory=list)  # task queues the run needs that no worker polls
    engines_down: list[str] = field(default_factory=list)  # the run's vLLM servers not answering /health


def reason(s: Snapshot) -> str | None:
    """What the run waits for, most telling first; None when it waits for nothing known."""
    parts = []
    if s.idle_queues:
        parts.append("workers down: no worker polls task queue " + ", ".join(repr(q) for q in s.idle_queues)
                     + " (start the workers, or the run's `vime train`)")
    for p in s.pending:
        if p.activity == PICK_TRAINER and p.failure_type == TRAINER_BUSY:
            held = HOLDER.search(p.failure)
            holder = f"run {held.group(2)} holds trainer {held.group(1)}" if held else p.failure
            parts.append(f"waits for a free trainer: {holder} (until that run ends)")
        elif p.attempt > 1 and p.failure and p.queue not in s.idle_queues:
            parts.append(f"{p.activity} retrying (attempt {p.attempt}): {p.failure.splitlines()[0][:200]}")
    if s.engines_down:
        parts.append("engine restarting: vLLM server " + ", ".join(s.engines_down) + " does not answer /health")
    return "; ".join(parts) or None


def pending_of(described: WorkflowExecutionDescription) -> list[Pending]:
    found = []
    for p in described.raw_description.pending_activities:
        failure = p.last_failure
        found.append(Pending(p.activity_type.name, p.attempt, failure.message,
                             failure.application_failure_info.type if failure.HasField("application_failure_info")
                             else "", p.activity_options.task_queue.name))
    return found


async def has_poller(client: Client, queue: str, kind: TaskQueueType.ValueType) -> bool:
    response = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
        namespace=client.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind))
    return bool(response.pollers)


async def observe(client: Client, described: WorkflowExecutionDescription,
                  engine_urls: list[str]) -> Snapshot:
    """Look at the run's workflow (`described`), the queues it needs and its vLLM servers."""
    pending = pending_of(described)
    queues = {(described.task_queue, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW)}
    queues |= {(p.queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY) for p in pending if p.queue}
    idle = sorted({q for q, kind in queues if not await has_poller(client, q, kind)})
    healthy = await asyncio.gather(*(wait_until_healthy(url, 0.0) for url in engine_urls))
    return Snapshot(pending, idle, [url for url, up in zip(engine_urls, healthy, strict=True) if not up])


def engine_urls_of(argv: list[str] | None) -> list[str]:
    """The vLLM servers a run's recorded flags name (`--vllm-server-urls`, else its router)."""
    argv = argv or []
    urls: list[str] = []
    for i, flag in enumerate(argv):
        if flag == "--vllm-server-urls":
            urls = list(takewhile(lambda a: not a.startswith("--"), argv[i + 1:]))
            break
    if not urls and "--vllm-router-ip" in argv and "--vllm-router-port" in argv:
        urls = [f"http://{argv[argv.index('--vllm-router-ip') + 1]}:{argv[argv.index('--vllm-router-port') + 1]}"]
    return urls
