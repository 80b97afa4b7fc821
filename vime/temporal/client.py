"""Connecting to Temporal: a given `--temporal-address`, or the embedded dev server.

`temporal_service(...)` is the one entry the CLI and workers use: it yields a connected
client whether the server is the user's cluster or a dev server vime started for the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.client import Client
from temporalio.runtime import LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter

from vime.errors import ServiceError
from vime.log import get_logger
from vime.temporal.dev_server import TemporalDevServer
from vime.temporal.search_attributes import SEARCH_ATTRIBUTES

log = get_logger(__name__)

_INDEXED = {
    "Keyword": IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    "Double": IndexedValueType.INDEXED_VALUE_TYPE_DOUBLE,
    "Int": IndexedValueType.INDEXED_VALUE_TYPE_INT,
    "Bool": IndexedValueType.INDEXED_VALUE_TYPE_BOOL,
}


# The SDK core warns (TMPRL1104) whenever a workflow task stays open over 5 s. A rollout group
# runs as a local activity inside its workflow's task, so every group longer than that (any agent
# rollout) logged one warning every few seconds; that is expected, not a problem: only errors of
# that component are logged.
_CORE_LOG_FILTER = (TelemetryFilter(core_level="WARN", other_level="ERROR").formatted()
                    + ",temporalio_sdk_core::worker::workflow::managed_run=ERROR")
_runtime: Runtime | None = None


def vime_runtime() -> Runtime:
    """The Temporal runtime every vime client uses (created once per process)."""
    global _runtime
    if _runtime is None:
        _runtime = Runtime(telemetry=TelemetryConfig(logging=LoggingConfig(filter=_CORE_LOG_FILTER)))
    return _runtime


# A server that listens but is still starting answers `Unavailable` ("Frontend is not healthy
# yet") for a moment: a dev server just started, or a cluster coming back. That is worth waiting
# out; any other error (a wrong address, a missing namespace) is reported at once.
_STARTING = ("not healthy yet", "code: Unavailable")


async def connect(address: str, namespace: str = "default", *, timeout: float = 10.0,
                  identity: str | None = None) -> Client:
    """Connect, or raise one `ServiceError` naming the address (the SDK would retry for long).
    `identity` names this process in Temporal (its workers' activities carry it)."""
    kwargs: dict = {"runtime": vime_runtime()}
    if identity:
        kwargs["identity"] = identity
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        try:
            return await asyncio.wait_for(Client.connect(address, namespace=namespace, **kwargs), max(0.1, left))
        except (asyncio.TimeoutError, RuntimeError, OSError) as e:
            detail = "timed out" if isinstance(e, asyncio.TimeoutError) else str(e).splitlines()[0]
            if any(s in detail for s in _STARTING) and time.monotonic() + 0.25 < deadline:
                await asyncio.sleep(0.25)
                continue
            raise ServiceError(
                f"cannot connect to Temporal at --temporal-address {address!r} (namespace {namespace!r}): "
                f"{detail}. Check the address, or omit --temporal-address to start an embedded dev server."
            ) from e


async def ensure_search_attributes(client: Client, namespace: str) -> None:
    """Register vime's search attributes on a server that lacks them (idempotent)."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    known = set(existing.custom_attributes) | set(existing.system_attributes)
    missing = {n: _INDEXED[k.cli_name] for n, k in SEARCH_ATTRIBUTES.items() if n not in known}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=namespace, search_attributes=missing)
        )
        log.info("temporal.search_attributes_added", names=sorted(missing))


@dataclass
class TemporalService:
    client: Client
    address: str
    ui_url: str | None
    dev_server: TemporalDevServer | None = None

    async def check(self) -> str | None:
        """Restart the embedded dev server if it died: same port, same database file, so the
        workers' and this client's connections come back by themselves; a line to print."""
        dev = self.dev_server
        if dev is None or dev.alive():
            return None
        code = dev.process.returncode if dev.process is not None else None
        t0 = time.monotonic()
        await asyncio.to_thread(dev.restart)
        return (f"[vime] the Temporal dev server died (exit code {code}); restarted it on {dev.address} with "
                f"{dev.db_path} in {time.monotonic() - t0:.1f} s")


async def _start_dev_server(run_dir: str | Path, namespace: str, headless: bool,
                            attempts: int = 3) -> tuple[TemporalDevServer, Client]:
    """A dev server on free ports, connected. Another process can take a "free" port between the
    pick and the server's bind, and then answers the readiness probe in its place: a connect
    that fails is retried on a fresh server with fresh ports."""
    for attempt in range(attempts):
        dev = TemporalDevServer(run_dir, namespace=namespace, headless=headless)
        try:
            await asyncio.to_thread(dev.start)
            return dev, await connect(dev.address, namespace)
        except ServiceError:
            await asyncio.to_thread(dev.stop)
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")


@contextlib.asynccontextmanager
async def temporal_service(
    address: str | None, *, run_dir: str | Path, namespace: str = "default", headless: bool = False
) -> AsyncIterator[TemporalService]:
    """Yield a connected `TemporalService`; start (and finally stop) a dev server if no address."""
    dev: TemporalDevServer | None = None
    if address is None:
        dev, client = await _start_dev_server(run_dir, namespace, headless)
        address = dev.address
    try:
        if dev is None:
            client = await connect(address, namespace)
        if dev is None:
            await ensure_search_attributes(client, namespace)
        yield TemporalService(client, address, dev.ui_url if dev else None, dev)
    finally:
        if dev is not None:
            await asyncio.to_thread(dev.stop)
