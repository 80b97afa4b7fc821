"""Worker for the rollout queue: the workflows (training, rollout, agent rollout) and the generate
activity; with `--rollout-workflow CodingAgentRolloutWorkflow` also the agent session activities
and, in the same process, a worker for the sandbox queue (its sandboxes are destroyed when it stops).

    python -m workers.rollout <vime flags> --temporal-address HOST:PORT    # one run's worker
    python -m workers.rollout --store-url URL --temporal-address HOST:PORT  # any run's (long-lived)

Generation reads each run's config by run id (`vime.run_args`). The agent activities still use
the worker's own flags: an agent run's workers are started with its flags.
"""

from __future__ import annotations

import asyncio
import sys

from temporalio.worker import Worker

from activities.coding_agent import CodingAgentActivities
from activities.metrics import MetricsActivities
from activities.rollout import RolloutActivities
from activities.sandbox import SandboxActivities
from activities.steps import StepActivities
from vime.agent.coding.config import close_shared_adapters
from vime.sandbox.bwrap import reap_stale_workdirs
from vime.args import parse_args_or_exit
from vime.rollout.generate import close_engine_clients
from vime.rollout.tokenization import get_tokenizer
from vime.store import SampleStore
from workers.common import (announce, connect_from_args, ensure_run, run_until_signalled, run_worker,
                            setup_logging)
from workflows.coding_agent import CodingAgentRolloutWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow

# Slots per worker: one per rollout group in flight. Groups run as local activities, and a group's
# workflow holds a workflow-task slot while its local activity runs; the SDK's defaults (100 of
# each) capped bench/concurrency.py at 800 of 1,000 sessions in flight (100 groups of 8), queued
# behind the slots rather than behind vLLM.
ROLLOUT_ACTIVITY_SLOTS = 256
ROLLOUT_LOCAL_ACTIVITY_SLOTS = 512
ROLLOUT_WORKFLOW_TASK_SLOTS = 512

async def serve(args) -> None:
    client = await connect_from_args(args, "rollout")
    if args.hf_checkpoint:  # the first load takes seconds: not inside an activity's event loop
        get_tokenizer(args.hf_checkpoint)
    with SampleStore.open(args.store_url) as store:
        ensure_run(args, store)
        acts = RolloutActivities(args, store)
        activities = [acts.register_run, acts.generate_group, acts.generate_rollout_step, *StepActivities(store).all(),
                      MetricsActivities(acts.runs).record_metrics]
        sandboxes = None
        workers = []
        if args.rollout_workflow == "CodingAgentRolloutWorkflow":  # agent sessions + the sandbox queues
            # boots and grading on the shared sandbox queue; what uses a booted sandbox (the session,
            # its diff, its teardown) on this process's own queue, where the sandbox lives
            sandboxes = SandboxActivities(args, store)
            agents = CodingAgentActivities(args, store)
            activities += agents.on_rollout_queue()
            if args.sandbox_backend == "bwrap":  # workdirs of workers killed with SIGKILL
                reap_stale_workdirs()
            workers.append(Worker(client, task_queue=args.sandbox_task_queue, activities=sandboxes.on_sandbox_queue(),
                                  max_concurrent_activities=64))
            workers.append(Worker(client, task_queue=sandboxes.host_queue,
                                  activities=sandboxes.on_host_queue() + agents.on_host_queue(),
                                  max_concurrent_activities=256))
        workers.insert(0, Worker(client, task_queue=args.rollout_task_queue,
                                 workflows=[TrainingWorkflow, RolloutWorkflow, CodingAgentRolloutWorkflow],
                                 activities=activities, max_concurrent_activities=ROLLOUT_ACTIVITY_SLOTS,
                                 max_concurrent_local_activities=ROLLOUT_LOCAL_ACTIVITY_SLOTS,
                                 max_concurrent_workflow_tasks=ROLLOUT_WORKFLOW_TASK_SLOTS))
        announce("rollout", workers, args)
        try:
            await run_until_signalled(workers)
        finally:  # each step bounded: a stopping worker must exit, and its sandboxes go first
            if sandboxes is not None:
                await asyncio.wait_for(sandboxes.destroy_booted(), 60)
            await asyncio.wait_for(close_shared_adapters(), 15)  # agent sessions and the generate hook
            await asyncio.wait_for(close_engine_clients(), 15)


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args_or_exit(argv)
    return run_worker(lambda: serve(args))


if __name__ == "__main__":
    sys.exit(main())
