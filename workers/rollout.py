"""Worker for the rollout queue: the training workflow, `vime eval`'s, the run's rollout environment
(`--rollout-env`: its workflows and activities, and the workers of its own queues, e.g. the
coding agent's sandbox queues) and the generate activities every run uses.

    python -m workers.rollout <vime flags> --temporal-address HOST:PORT    # one run's worker
    python -m workers.rollout --store-url URL --temporal-address HOST:PORT  # any run's (long-lived)

Every activity reads its run's config by run id (`vime.config.run_args`; environments through
`EnvContext.run_args`): the worker's own flags give its connections and queues. A worker started
with a run's flags serves that run's environment; a long-lived one (connections only) serves the
environments in vime (`LONG_LIVED_ENVS`: all four built-ins) and the one its `--rollout-env` names, so a coding-agent
run starts on it from the JSON of `vime config` like any other.
"""

from __future__ import annotations

import asyncio
import socket
import sys

from temporalio.worker import Worker

from activities.metrics import MetricsActivities
from activities.rollout import RolloutActivities
from activities.steps import StepActivities
from vime.agent.shared_adapter import close_shared_adapters
from vime.config.args import parse_args_or_exit
from vime.envs import BUILTIN, EnvContext, Environment, load_environment, resolve, workflow_classes
from vime.rollout.generate import close_engine_clients
from vime.rollout.tokenization import get_tokenizer
from vime.store import SampleStore
from vime.temporal.build_id import code_build_id
from vime.config.run_args import serves_own_run
from workers.common import (announce, connect_from_args, ensure_run, run_until_signalled, run_worker,
                            setup_logging)
from workflows.evaluation import EvalWorkflow
from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow

# Slots per worker: one per rollout group in flight. Groups run as local activities, and a group's
# workflow holds a workflow-task slot while its local activity runs; the SDK's defaults (100 of
# each) capped bench/concurrency.py at 800 of 1,000 sessions in flight (100 groups of 8), queued
# behind the slots rather than behind vLLM.
ROLLOUT_ACTIVITY_SLOTS = 256
ROLLOUT_LOCAL_ACTIVITY_SLOTS = 512
ROLLOUT_WORKFLOW_TASK_SLOTS = 512
# Workflow task pollers. A child group workflow's first task comes on the queue's normal (not
# sticky) side; the SDK's 5 pollers at its 0.2 ratio keep one poll there, so a step's 8 children
# took their first tasks one poll at a time (0.1-0.5 s each, docs/performance.md). 16 at 0.5:
# 8 normal polls, 8 sticky ones (the training workflow's and the children's later tasks).
ROLLOUT_WORKFLOW_TASK_POLLS = 16
ROLLOUT_NONSTICKY_POLL_RATIO = 0.5

LONG_LIVED_ENVS = tuple(BUILTIN)  # the environments vime ships: a long-lived worker serves a run of any of them


def served_environments(args) -> list[Environment]:
    """The environments whose workflows and activities this worker registers: its run's, or, on a
    long-lived worker, vime's own plus `--rollout-env`'s."""
    names = [args.rollout_env] if serves_own_run(args) else [*LONG_LIVED_ENVS, args.rollout_env]
    return [load_environment(name) for name in dict.fromkeys(names)]


async def serve(args) -> None:
    client = await connect_from_args(args, "rollout")
    if args.hf_checkpoint:  # the first load takes seconds: not inside an activity's event loop
        get_tokenizer(args.hf_checkpoint)
    with SampleStore.open(args.store_url) as store:
        ensure_run(args, store)
        acts = RolloutActivities(args, store)
        exporter = serve_metrics(args)
        metrics = MetricsActivities(acts.runs, exporter)
        activities = [acts.register_run, acts.generate_group, acts.generate_rollout_step, *StepActivities(store).all(),
                      metrics.record_metrics, *acts.evals.all()]
        envs = served_environments(args)
        if args.sandbox_backend == "bwrap":  # any environment's sandboxes (agent
            from vime.sandbox.bwrap import reap_stale_workdirs  # sessions, tool calls) left by a
            reap_stale_workdirs()  # worker killed with SIGKILL: gone before this one boots its own
        workflows = [TrainingWorkflow, RolloutWorkflow, EvalWorkflow]
        context = EnvContext(args, store, client, runs=acts.runs)
        extras = []
        for env in envs:
            workflows += [w for w in workflow_classes(env) if w not in workflows]
            if env.activities:
                extras.append(resolve(env.activities, "activities", env)(context))
        workers = [w for extra in extras for w in extra.workers]
        activities += [a for extra in extras for a in extra.activities]
        workers.insert(0, Worker(client, task_queue=args.rollout_task_queue, workflows=workflows,
                                 activities=activities, max_concurrent_activities=ROLLOUT_ACTIVITY_SLOTS,
                                 max_concurrent_local_activities=ROLLOUT_LOCAL_ACTIVITY_SLOTS,
                                 max_concurrent_workflow_tasks=ROLLOUT_WORKFLOW_TASK_SLOTS,
                                 max_concurrent_workflow_task_polls=ROLLOUT_WORKFLOW_TASK_POLLS,
                                 nonsticky_to_sticky_poll_ratio=ROLLOUT_NONSTICKY_POLL_RATIO,
                                 build_id=code_build_id()))
        announce("rollout", workers, args)
        polling = None
        if exporter:
            polling = asyncio.create_task(exporter.poll_queues(client, args.temporal_namespace, [
                (args.rollout_task_queue, "workflow"), (args.rollout_task_queue, "activity"),
                (args.trainer_task_queue, "activity"), (args.sandbox_task_queue, "activity")]))
        try:
            await run_until_signalled(workers)
        finally:  # each step bounded: a stopping worker must exit, and its sandboxes go first
            for extra in extras:  # the environments' sandboxes go first
                if extra.close is not None:
                    await asyncio.wait_for(extra.close(), 60)
            await asyncio.wait_for(close_shared_adapters(), 15)  # agent sessions and agent generate hooks
            await asyncio.wait_for(close_engine_clients(), 15)
            await asyncio.wait_for(asyncio.to_thread(metrics.close), 30)  # the runs' last lines; W&B runs finished
            if polling:
                polling.cancel()
                exporter.close()


def serve_metrics(args):
    """`--metrics-port`: this worker's Prometheus endpoint (`vime.metrics.prometheus`), or None."""
    if args.metrics_port is None:
        return None
    from vime.metrics.prometheus import WorkerMetrics

    exporter = WorkerMetrics()
    port = exporter.serve(args.metrics_port)
    print(f"[vime] worker rollout metrics: http://{socket.gethostname()}:{port}/metrics", flush=True)
    return exporter


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args_or_exit(argv)
    return run_worker(lambda: serve(args))


if __name__ == "__main__":
    sys.exit(main())
