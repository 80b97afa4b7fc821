"""The worker `vime smoke` starts: `SmokeWorkflow` and its `smoke_generate` activity on one queue.

    python -m workers.smoke --temporal-address HOST:PORT [--temporal-namespace NS] --task-queue Q
"""

from __future__ import annotations

import argparse

from temporalio.worker import Worker

from activities.smoke import smoke_generate
from vime.temporal.build_id import code_build_id
from workers.common import command_worker_main, connect_from_args, run_until_signalled
from workflows.smoke import SmokeWorkflow


async def serve(args: argparse.Namespace) -> None:
    client = await connect_from_args(args, kind="smoke")
    await run_until_signalled([Worker(client, task_queue=args.task_queue, workflows=[SmokeWorkflow],
                                      activities=[smoke_generate], build_id=code_build_id())])


def main(argv: list[str] | None = None) -> int:
    return command_worker_main(argv, "python -m workers.smoke", __doc__.splitlines()[0], serve,
                               lambda parser: parser.add_argument("--task-queue", required=True))


if __name__ == "__main__":
    raise SystemExit(main())
