"""What every worker entry point shares: flags, logging, the Temporal connection, clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from vime.errors import ConfigError
from vime.log import configure_logging
from vime.temporal.client import connect


async def connect_from_args(args) -> Client:
    if not args.temporal_address:
        raise ConfigError("a worker needs --temporal-address (`vime train` passes the one it started)")
    return await connect(args.temporal_address, args.temporal_namespace)


async def run_until_signalled(workers: Sequence[Worker]) -> None:
    """Run the workers until SIGINT/SIGTERM, then shut them down gracefully (in-flight tasks finish
    or are handed back to Temporal), so a stopped worker loses nothing."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
    await asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True)
    for task in runs:
        if task.done() and task.exception():
            raise task.exception()


def setup_logging() -> None:
    configure_logging()
