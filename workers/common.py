"""What every worker entry point shares: flags, logging, the Temporal connection, clean stop."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from vime.errors import ConfigError
from vime.log import configure_logging, get_logger
from vime.temporal.client import connect

log = get_logger(__name__)


async def connect_from_args(args) -> Client:
    if not args.temporal_address:
        raise ConfigError("a worker needs --temporal-address (`vime train` passes the one it started)")
    return await connect(args.temporal_address, args.temporal_namespace)


async def run_until_signalled(workers: Sequence[Worker], shutdown_timeout: float = 15.0) -> None:
    """Run the workers until SIGINT/SIGTERM, then shut them down gracefully (in-flight tasks finish
    or are handed back to Temporal), so a stopped worker loses nothing. A shutdown that takes
    longer than `shutdown_timeout` is abandoned (its activities time out on the server and are
    retried elsewhere), so the caller's own cleanup always runs and the process exits."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    runs = [asyncio.create_task(w.run()) for w in workers]
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait([waiter, *runs], return_when=asyncio.FIRST_COMPLETED)
    if stop.is_set():
        exit_anyway(after=2 * shutdown_timeout)
    try:
        await asyncio.wait_for(asyncio.gather(*(w.shutdown() for w in workers), return_exceptions=True),
                               shutdown_timeout)
    except asyncio.TimeoutError:
        log.warning("worker.shutdown_timeout", seconds=shutdown_timeout)
        return
    for task in runs:
        if task.done() and task.exception():
            raise task.exception()


def exit_anyway(after: float) -> None:
    """Last resort for a stop request: end the process `after` seconds from now even if some task
    ignores cancellation, so Ctrl-C always stops a worker (its cleanup runs before that)."""
    def hard_exit() -> None:
        log.warning("worker.forced_exit", seconds=after)
        os._exit(0)

    timer = threading.Timer(after, hard_exit)
    timer.daemon = True
    timer.start()


def setup_logging() -> None:
    configure_logging()
