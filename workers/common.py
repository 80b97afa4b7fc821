"""What every worker entry point shares: flags, logging, the Temporal connection, clean stop.

A worker started by hand (a cluster) must need nothing but its flags: on start it registers
vime's search attributes on the Temporal server (idempotent) and creates its run in the store if
it is new, then prints one line when it polls. A configuration error found while starting is
printed as one line and ends the process with exit code 2, which `vime train`'s supervisor takes
as "do not restart me, stop the run with this message".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence

from temporalio.client import Client
from temporalio.worker import Worker

from vime.errors import ConfigError, ServiceError, VimeError
from vime.log import configure_logging, get_logger
from vime.config.run_args import serves_own_run, stored_config
from vime.temporal.client import connect, ensure_search_attributes

log = get_logger(__name__)

IDENTITY_ENV = "VIME_WORKER_IDENTITY"
CONNECT_WAIT_S = 120.0


def worker_identity(kind: str) -> str:
    """The Temporal identity of this process's workers: the one `vime train` assigned (so it can
    tell Temporal which activities died with this process), else `kind-pid@host`."""
    return os.environ.get(IDENTITY_ENV) or f"{kind}-{os.getpid()}@{socket.gethostname()}"


async def connect_from_args(args, kind: str = "worker", wait: float = CONNECT_WAIT_S) -> Client:
    """Connect to `--temporal-address`, waiting up to `wait` s for a server that is still starting
    (workers may start first), then register vime's search attributes there."""
    if not args.temporal_address:
        raise ConfigError("a worker needs --temporal-address (`vime train` passes the one it started)")
    deadline = time.monotonic() + wait
    while True:
        try:
            client = await connect(args.temporal_address, args.temporal_namespace, identity=worker_identity(kind))
            break
        except ServiceError:
            if time.monotonic() > deadline:
                raise
            log.warning("worker.waiting_for_temporal", address=args.temporal_address)
            await asyncio.sleep(2.0)
    await ensure_search_attributes(client, args.temporal_namespace)
    return client


def ensure_run(args, store) -> None:
    """Create the worker's own run in the store on first use (a worker started by hand with a
    run's flags, before any launcher). A long-lived worker has none: runs record themselves."""
    if serves_own_run(args):
        store.ensure_run(args.run_id, stored_config(args))


def announce(kind: str, workers: Sequence[Worker], args) -> None:
    queues = ", ".join(w.task_queue for w in workers)
    serves = f"run {args.run_id}" if serves_own_run(args) else "any run"
    print(f"[vime] worker {kind} ready: {serves}, Temporal {args.temporal_address}, queues {queues}", flush=True)


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


def run_worker(serve: Callable[[], Awaitable[None]]) -> int:
    """Run a worker's `serve()`; a vime error is one line on stderr and exit code 2 (configuration)
    or 1 (a service it needs is missing), not a traceback."""
    try:
        asyncio.run(serve())
    except VimeError as e:
        print(f"vime: error: {e}", file=sys.stderr, flush=True)
        return 1 if isinstance(e, ServiceError) else 2
    return 0


def command_worker_main(argv: list[str] | None, prog: str, description: str,
                        serve: Callable[[argparse.Namespace], Awaitable[None]],
                        add_flags: Callable[[argparse.ArgumentParser], None] = lambda parser: None) -> int:
    """The entry point of a worker one command starts for itself (`vime smoke`, `vime rescore`):
    its flags are the Temporal connection plus `add_flags`' own."""
    setup_logging()
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--temporal-address", required=True)
    parser.add_argument("--temporal-namespace", default="default")
    add_flags(parser)
    args = parser.parse_args(argv)
    return run_worker(lambda: serve(args))
