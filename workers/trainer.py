"""Worker for a trainer process group: rank 0 serves Temporal, the other ranks follow it.

    python -m workers.trainer <vime flags> --temporal-address HOST:PORT
    torchrun --nproc-per-node 8 -m workers.trainer <vime flags> --temporal-address HOST:PORT

Rank 0 announces itself on the shared `--trainer-task-queue` (activity `pick_trainer`) and
serves the trainer activities on a queue of its own, since the model state lives here.

Started without a model (`--store-url URL --temporal-address HOST:PORT` only) it is long-lived:
each run that picks it leases it, and attaching loads that run's model with that run's settings,
read from the store by run id (`vime.config.run_args`).
"""

from __future__ import annotations

import os
import socket
import sys
import uuid

from temporalio.worker import Worker

from activities.train import TrainerActivities
from vime.config.args import parse_args_or_exit
from vime.config.run_args import run_configs
from vime.train import cpu_threads
from vime.train import distributed as dist_utils
from vime.train.trainer_group import TrainerGroup
from vime.temporal.build_id import code_build_id
from workers.common import announce, connect_from_args, run_until_signalled, run_worker, setup_logging


async def serve(args, group: TrainerGroup) -> None:
    client = await connect_from_args(args, "trainer")
    queue = f"{args.trainer_task_queue}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    acts = TrainerActivities.serving(group, queue)
    announcer = Worker(client, task_queue=args.trainer_task_queue, activities=[acts.pick_trainer],
                       build_id=code_build_id())
    own = Worker(client, task_queue=queue, activities=acts.all(),
                 max_concurrent_activities=acts.max_runs + 3,  # each held run's next command waits in turn
                 build_id=code_build_id())
    announce("trainer", [announcer, own], args)
    await run_until_signalled([announcer, own])


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse_args_or_exit(argv)
    cpu_threads.apply(args)  # a CPU trainer beside its local engine leaves it a core when rollouts overlap
    # Join the ranks before asking which one this is: a long-lived trainer loads no model here, and
    # under torchrun each rank took itself for rank 0 and served Temporal on its own.
    dist_utils.init_distributed()
    group = TrainerGroup(args, run_configs(args))
    if dist_utils.rank() != 0:
        group.follow()
        return 0
    try:
        return run_worker(lambda: serve(args, group))
    finally:
        group.stop()


if __name__ == "__main__":
    sys.exit(main())
