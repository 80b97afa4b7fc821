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
from workers.common import connect_from_args, run_until_signalled, run_worker, setup_logging
from workflows.rescore import RescoreWorkflow


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.rescore", description=__doc__.splitlines()[0])
    parser.add_argument("--temporal-address", required=True)
    parser.add_argument("--temporal-namespace", default="default")
    parser.add_argument("--store", required=True, help="the run's directory (its SQLite store) or a store URL")
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    client = await connect_from_args(args, kind="rescore")
    with SampleStore.open(args.store, lock_wait_s=30) as store:
        acts = RescoreActivities(store)
        worker = Worker(client, task_queue=RESCORE_TASK_QUEUE, workflows=[RescoreWorkflow],
                        activities=[acts.rescore_page], build_id=code_build_id())
        await run_until_signalled([worker])


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse(argv)
    return run_worker(lambda: serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
