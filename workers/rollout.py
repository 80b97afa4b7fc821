"""Worker for the rollout queue: the workflows (training, rollout) and the generate activity.

    python -m workers.rollout <vime flags> --temporal-address HOST:PORT
"""

from __future__ import annotations

import asyncio
import sys

from temporalio.worker import Worker

from activities.rollout import RolloutActivities
from vime.args import parse_args_or_exit
from vime.rollout.generate import close_engine_clients
from vime.rollout.tokenization import get_tokenizer
from vime.store import SampleStore
from workers.common import connect_from_args, run_until_signalled, setup_logging
from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow


async def serve(args) -> None:
    client = await connect_from_args(args)
    if args.hf_checkpoint:  # the first load takes seconds: not inside an activity's event loop
        get_tokenizer(args.hf_checkpoint)
    with SampleStore.open(args.store_url) as store:
        acts = RolloutActivities(args, store)
        worker = Worker(client, task_queue=args.rollout_task_queue,
                        workflows=[TrainingWorkflow, RolloutWorkflow], activities=[acts.generate_group, acts.generate_rollout_step],
                        max_concurrent_activities=256)
        try:
            await run_until_signalled([worker])
        finally:
            await close_engine_clients()


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    asyncio.run(serve(parse_args_or_exit(argv)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
