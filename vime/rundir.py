"""One launcher per run directory, and a clean slate before it starts anything.

`RunDirLock` holds an exclusive `flock` on `<run_dir>/launcher.lock` for the launcher's life.
The kernel drops the lock when the process dies, however it dies, so a launcher killed with
SIGKILL never leaves a stale lock behind, while a second `vime train` on a directory whose
launcher is alive stops at once with one line naming that launcher's pid.

Holding the lock, the launcher owns every process of the directory: whatever an earlier launch
left running (found by `VIME_RUN_DIR` in its environment, see `vime.procs`) is stopped before
anything new starts, so two generations of workers never train the same run.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path

from vime.errors import ConfigError
from vime.procs import kill_leftovers

LOCK_NAME = "launcher.lock"


class RunDirLock:
    """`with RunDirLock(run_dir) as lock:` — `lock.leftovers` lists the pids stopped on entry."""

    def __init__(self, run_dir: str | Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.leftovers: list[int] = []
        self._fd: int | None = None

    def __enter__(self) -> RunDirLock:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _pid_in(fd)
            os.close(fd)
            raise in_use(self.run_dir, holder) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._fd = fd
        self.leftovers = kill_leftovers(self.run_dir)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def _pid_in(fd: int) -> str:
    return os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"


def in_use(run_dir: str | Path, holder: str) -> ConfigError:
    return ConfigError(f"run directory {str(run_dir)!r} is in use by another vime process (`vime train` or "
                       f"`vime ui`, pid {holder}); wait for it, stop it (kill {holder}), or pass another --run-dir")


def holder(run_dir: str | Path) -> str | None:
    """The pid of the live process holding `run_dir`'s lock, else None; found without creating or
    writing anything, so a launch that is refused leaves the live run's directory as it was.

    For checks before the launch takes the lock itself (`vime.config.preflight`): the lock may change
    hands meanwhile, and `RunDirLock` stays the authority."""
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)
    except OSError:  # no directory or no lock file: no launch ever held it
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released when fd closes, a moment later
    except BlockingIOError:
        return _pid_in(fd)
    finally:
        os.close(fd)
    return None


def refuse_if_held(run_dir: str | Path) -> None:
    """The lock's one-line `ConfigError` when a live process holds `run_dir`: for whatever would
    write into a run directory before the launch takes the lock (`vime.config.preflight`, the examples'
    prompt files), so that a refused launch leaves the live run's files as they were."""
    pid = holder(run_dir)
    if pid is not None:
        raise in_use(run_dir, pid)


LAUNCH_INFO = "launch.json"


def write_launch_info(run_dir: str | Path, **info: object) -> None:
    """Where the live launch serves the run (its Temporal, its Web UI), for `vime status`.
    Written whole (rename), removed when the launch ends; a killed launch's file is ignored by
    `read_launch_info` because its pid is gone."""
    path = Path(run_dir) / LAUNCH_INFO
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"pid": os.getpid(), **info}))
    tmp.replace(path)


def remove_launch_info(run_dir: str | Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (Path(run_dir) / LAUNCH_INFO).unlink()


def read_launch_info(run_dir: str | Path) -> dict | None:
    """The live launch's info; None when no launch of the run is running."""
    try:
        info = json.loads((Path(run_dir) / LAUNCH_INFO).read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info
