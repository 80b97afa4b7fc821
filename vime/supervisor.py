"""Worker processes of a local run, restarted when they die.

`vime train` runs its workers as child processes (never in-process): a crashed or killed worker
takes only its own state with it, and Temporal hands its unfinished activities to the restarted
one. That is the whole recovery story on one machine: restart the workers, the run goes on.

Each start of a worker gets its own Temporal identity (`VIME_WORKER_IDENTITY`), so when one dies
the launcher can tell Temporal at once which activities were lost (`vime.recovery`), instead of
waiting for their heartbeat timeouts.

Restarting is for crashes, not for mistakes: a worker that exits with code 2 (a configuration
error it printed as one line), or that dies twice in a row within `STARTUP_WINDOW_S` of starting
with the same last error, stops the run with that error instead of being restarted again.
"""

from __future__ import annotations

import os
import socket
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from vime.errors import ConfigError, ServiceError
from vime.log import get_logger
from vime.procs import exit_cause, last_error_line, log_tail, spawn, stop_process_group

log = get_logger(__name__)

IDENTITY_ENV = "VIME_WORKER_IDENTITY"
LAUNCH_ID = uuid.uuid4().hex[:6]  # this launcher's: part of every identity its workers get
CONFIG_ERROR_EXIT = 2
STARTUP_WINDOW_S = 90.0


@dataclass
class WorkerDeath:
    """A worker that died and was restarted: what the launcher reports and recovers from."""

    name: str
    identity: str  # the dead process's Temporal identity
    exit_code: int | None
    cause: str


@dataclass
class WorkerProcess:
    name: str
    module: str  # e.g. "workers.rollout"
    argv: list[str]
    log_path: Path
    run_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    process: object | None = None
    restarts: int = 0
    identity: str = ""
    started_at: float = 0.0
    launch: str = field(default_factory=lambda: LAUNCH_ID)

    def start(self) -> None:
        self.identity = f"{self.name}-{self.launch}-{self.restarts}@{socket.gethostname()}"
        env = {**os.environ, **self.env, IDENTITY_ENV: self.identity}
        self.process = spawn([sys.executable, "-m", self.module, *self.argv], self.log_path, env=env,
                             run_dir=self.run_dir)
        self.started_at = time.monotonic()
        log.info("worker.started", worker=self.name, pid=self.process.pid, log=str(self.log_path))

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM first: workers shut down gracefully, handing unfinished tasks back to Temporal."""
        proc, self.process = self.process, None
        stop_process_group(proc, timeout)


class Supervisor:
    """Keeps a set of worker processes alive: `check()` restarts any that died."""

    def __init__(self, workers: list[WorkerProcess], *, max_restarts: int = 20) -> None:
        self.workers = {w.name: w for w in workers}
        self.max_restarts = max_restarts
        self._early_deaths: dict[str, str | None] = {}  # worker -> last error of its last early death

    def __enter__(self) -> Supervisor:
        for w in self.workers.values():
            w.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.workers.values():
            w.stop()

    def check(self) -> list[WorkerDeath]:
        """Restart dead workers; return their deaths. Raises when restarting cannot help."""
        deaths = []
        for w in self.workers.values():
            if w.alive():
                continue
            code = w.process.returncode if w.process else None
            crashed = code is not None and 0 < code <= 128  # not killed by a signal
            cause = last_error_line(w.log_path) if crashed else None
            early = crashed and time.monotonic() - w.started_at < STARTUP_WINDOW_S
            if code == CONFIG_ERROR_EXIT:
                raise ConfigError(_strip_prefix(cause) or f"worker {w.name} stopped on a configuration error; "
                                  f"see {w.log_path}")
            if early and w.name in self._early_deaths and self._early_deaths[w.name] == cause:
                raise ServiceError(f"worker {w.name} died twice right after starting: {cause or f'exit code {code}'}; "
                                   f"see {w.log_path}")
            if w.restarts >= self.max_restarts:
                raise ServiceError(f"worker {w.name} died {w.restarts + 1} times (last exit code {code}); "
                                   f"last lines of {w.log_path}:\n{log_tail(w.log_path, 20)}")
            if early:
                self._early_deaths[w.name] = cause
            else:
                self._early_deaths.pop(w.name, None)
            log.warning("worker.died", worker=w.name, exit_code=code, restarts=w.restarts)
            deaths.append(WorkerDeath(w.name, w.identity, code, exit_cause(code, w.log_path)))
            w.stop(timeout=1)  # the guard already cleaned up; this reaps it
            w.restarts += 1
            w.start()
        return deaths


def _strip_prefix(line: str | None) -> str | None:
    """`vime: error: X` (a worker's one-line configuration error) -> `X`."""
    if line is None:
        return None
    for prefix in ("vime: error: ", "vime train: error: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line
