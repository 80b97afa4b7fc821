"""The worker `vime smoke` starts: `SmokeWorkflow` and its `smoke_generate` activity on one queue.

    python -m workers.smoke --temporal-address HOST:PORT [--temporal-namespace NS] --task-queue Q
"""

from __future__ import annotations

import argparse

from temporalio.worker import Worker

from activities.smoke import smoke_generate
from vime.temporal.build_id import code_build_id
from workers.common import connect_from_args, run_until_signalled, run_worker, setup_logging
from workflows.smoke import SmokeWorkflow


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m workers.smoke", description=__doc__.splitlines()[0])
    parser.add_argument("--temporal-address", required=True)
    parser.add_argument("--temporal-namespace", default="default")
    parser.add_argument("--task-queue", required=True)
    return parser.parse_args(argv)


async def serve(args: argparse.Namespace) -> None:
    client = await connect_from_args(args, kind="smoke")
    worker = Worker(client, task_queue=args.task_queue, workflows=[SmokeWorkflow], activities=[smoke_generate],
                    build_id=code_build_id())
    await run_until_signalled([worker])


def main(argv: list[str] | None = None) -> int:
    setup_logging()
    args = parse(argv)
    return run_worker(lambda: serve(args))


if __name__ == "__main__":
    raise SystemExit(main())
