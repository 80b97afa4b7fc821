"""Worker processes of a local run, restarted when they die.

`vime train` runs its workers as child processes (never in-process): a crashed or killed worker
takes only its own state with it, and Temporal hands its unfinished activities to the restarted
one. That is the whole recovery story on one machine: restart the workers, the run goes on.

A worker's death is seen the moment it happens: a thread per worker process waits on it
(`Popen.wait`, a blocking `waitpid`) and calls the supervisor's `on_exit` callbacks, so the
launcher does not find out on its next look, which a query to a workflow whose worker just died
held for ~30 s (issue 21).

Each start of a worker gets its own Temporal identity (`VIME_WORKER_IDENTITY`), so when one dies
the launcher can tell Temporal at once which activities were lost (`vime.launcher.recovery`), instead of
waiting for their heartbeat timeouts.

Restarting is for crashes, not for mistakes: a worker that exits with code 2 (a configuration
error it printed as one line), or that dies twice in a row within `STARTUP_WINDOW_S` of starting
with the same last error, stops the run with that error instead of being restarted again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from vime.errors import ConfigError, ServiceError
from vime.log import get_logger
from vime.procs import exit_cause, last_error_line, log_tail, spawn, stop_process_group, stop_process_groups

log = get_logger(__name__)

IDENTITY_ENV = "VIME_WORKER_IDENTITY"
LAUNCH_ID = uuid.uuid4().hex[:6]  # this launcher's: part of every identity its workers get
CONFIG_ERROR_EXIT = 2
STARTUP_WINDOW_S = 90.0
WORKER_STOP_S = 30.0  # SIGTERM to SIGKILL, for all of them at once: a worker gives up its own shutdown at 15 s


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

    def start(self, on_exit: Callable[[], None] | None = None) -> None:
        """Spawn the worker; `on_exit()` is called from a watcher thread the moment it exits."""
        self.identity = f"{self.name}-{self.launch}-{self.restarts}@{socket.gethostname()}"
        env = {**os.environ, **self.env, IDENTITY_ENV: self.identity}
        self.process = spawn([sys.executable, "-m", self.module, *self.argv], self.log_path, env=env,
                             run_dir=self.run_dir)
        self.started_at = time.monotonic()
        if on_exit is not None:
            threading.Thread(target=_wait_then, args=(self.process, on_exit), name=f"watch-{self.name}",
                             daemon=True).start()
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


@contextlib.contextmanager
def running(worker: WorkerProcess) -> Iterator[WorkerProcess]:
    """One worker for the length of a command (`vime smoke`, `vime rescore`): started, then stopped
    (SIGTERM first) however the command ends. Not restarted: `while_alive` reports its death."""
    worker.start()
    try:
        yield worker
    finally:
        worker.stop(WORKER_STOP_S)


T = TypeVar("T")


async def while_alive(worker: WorkerProcess, awaitable: Awaitable[T], poll_s: float = 0.5) -> T:
    """`awaitable`'s result, unless `worker` exits first: then the error a command prints, with the
    worker's last words and its log (a `ConfigError` when it exited with a configuration error)."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait([task], timeout=poll_s)
            if done:
                return task.result()
            code = worker.process.poll() if worker.process is not None else None
            if worker.process is not None and code is not None:
                error = ConfigError if code == CONFIG_ERROR_EXIT else ServiceError
                raise error(f"the {worker.name} worker exited ({exit_cause(code, worker.log_path)}); "
                            f"its log: {worker.log_path}")
    finally:
        task.cancel()


def _wait_then(process, on_exit: Callable[[], None]) -> None:
    process.wait()  # Popen serializes waitpid: `poll()` elsewhere answers "running" until this returns
    on_exit()


class Supervisor:
    """Keeps a set of worker processes alive: `check()` restarts any that died; `on_exit(callback)`
    tells at once (from a watcher thread) that one exited, so `check()` need not wait for a poll."""

    def __init__(self, workers: list[WorkerProcess], *, max_restarts: int = 20,
                 stop_with: Callable[[], None] | None = None) -> None:
        self.workers = {w.name: w for w in workers}
        self.max_restarts = max_restarts
        self.stop_with = stop_with  # called once the workers are gone: what they used may go now (the services)
        self._early_deaths: dict[str, str | None] = {}  # worker -> last error of its last early death
        self._on_exit: list[Callable[[], None]] = []

    def on_exit(self, callback: Callable[[], None]) -> None:
        """Call `callback()` (from a watcher thread) whenever a worker process exits."""
        self._on_exit.append(callback)

    def _exited(self) -> None:
        for callback in list(self._on_exit):
            try:
                callback()
            except RuntimeError:  # its event loop closed meanwhile (the launch is ending): nobody to tell
                pass

    def __enter__(self) -> Supervisor:
        for w in self.workers.values():
            w.start(self._exited)
        return self

    def __exit__(self, *exc: object) -> None:
        """Stop every worker at once, then call `stop_with`: one thing after another, a launch took
        38 s to stop on SIGTERM (issue 21). Not the services with the workers: a rollout worker
        whose vLLM server goes away under it waits out its whole shutdown timeout (15 s)."""
        stop_process_groups([w.process for w in self.workers.values()], WORKER_STOP_S)
        for w in self.workers.values():
            w.process = None
        if self.stop_with is not None:
            self.stop_with()

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
            w.start(self._exited)
        return deaths


def _strip_prefix(line: str | None) -> str | None:
    """`vime: error: X` (a worker's one-line configuration error) -> `X`."""
    if line is None:
        return None
    for prefix in ("vime: error: ", "vime train: error: "):
        if line.startswith(prefix):
            return line[len(prefix):]
    return line
