"""Worker processes of a local run, restarted when they die.

`vime train` runs its workers as child processes (never in-process): a crashed or killed worker
takes only its own state with it, and Temporal hands its unfinished activities to the restarted
one. That is the whole recovery story on one machine: restart the workers, the run goes on.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vime.log import get_logger
from vime.procs import log_tail, stop_process_group

log = get_logger(__name__)


@dataclass
class WorkerProcess:
    name: str
    module: str  # e.g. "workers.rollout"
    argv: list[str]
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen | None = None
    restarts: int = 0

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.argv], stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, env={**os.environ, **self.env}, start_new_session=True,
            )
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

    def __enter__(self) -> Supervisor:
        for w in self.workers.values():
            w.start()
        return self

    def __exit__(self, *exc: object) -> None:
        for w in self.workers.values():
            w.stop()

    def check(self) -> list[str]:
        """Restart dead workers; return the names restarted. Raises after too many restarts."""
        restarted = []
        for w in self.workers.values():
            if w.alive():
                continue
            code = w.process.returncode if w.process else None
            if w.restarts >= self.max_restarts:
                from vime.errors import ServiceError

                raise ServiceError(f"worker {w.name} died {w.restarts + 1} times (last exit code {code}); "
                                   f"last lines of {w.log_path}:\n{log_tail(w.log_path, 20)}")
            log.warning("worker.died", worker=w.name, exit_code=code, restarts=w.restarts)
            w.restarts += 1
            time.sleep(0.5)
            w.start()
            restarted.append(w.name)
        return restarted
