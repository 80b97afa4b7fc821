"""The worker `vime rescore` starts: `RescoreWorkflow` and its `rescore_page` activity, on the
rescore queue, reading and writing the store at `--store` (a run directory or a URL).

    python -m workers.rescore --temporal-address HOST:PORT [--temporal-namespace NS] --store LOCATION
"""

from __future__ import annotations

import argparse

from temporalio.worker import Worker

from activities.rescore import RescoreActivities
from vime.store import SampleStore
from vime.temporal.build_id import code_build_id
from vime.temporal.rescore import RESCORE_TASK_QUEUE
from workers.common import command_worker_main, connect_from_args, run_until_signalled
from workflows.rescore import RescoreWorkflow


async def serve(args: argparse.Namespace) -> None:
    client = await connect_from_args(args, kind="rescore")
    with SampleStore.open(args.store, lock_wait_s=30) as store:
        await run_until_signalled([Worker(client, task_queue=RESCORE_TASK_QUEUE, workflows=[RescoreWorkflow],
                                          activities=[RescoreActivities(store).rescore_page],
                                          build_id=code_build_id())])


def main(argv: list[str] | None = None) -> int:
    return command_worker_main(argv, "python -m workers.rescore", __doc__.splitlines()[0], serve, lambda parser:
                               parser.add_argument("--store", required=True, help="a run directory or a store URL"))


if __name__ == "__main__":
    raise SystemExit(main())
