"""Child processes that vime starts (vLLM, Temporal, a router, workers): starting, stopping
and quoting their logs, done one way.

Every child starts through `vime.procguard` in a session of its own: the guard dies with the
launcher (parent-death signal), adopts what its command leaves behind, and kills it all when
the command ends; stopping the guard's process group reaches the grandchildren too (vLLM's
engine core, torch workers). Every child also carries `VIME_RUN_DIR` in its environment (its
descendants inherit it), which is how a later launch finds leftovers of an earlier one that
could not clean up after itself (`leftover_processes`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

RUN_DIR_ENV = "VIME_RUN_DIR"
_spawned: weakref.WeakSet[subprocess.Popen] = weakref.WeakSet()  # this process's children, for `ask_all_to_stop`


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def spawn(cmd: Sequence[str], log_path: str | Path, *, env: Mapping[str, str] | None = None,
          run_dir: str | Path | None = None) -> subprocess.Popen:
    """Start `cmd` under the guard, output appended to `log_path` (a header line marks each start,
    so a restarted service's log keeps the previous one's last words)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    full_env = dict(os.environ if env is None else env)
    if run_dir is not None:
        full_env[RUN_DIR_ENV] = str(Path(run_dir).resolve())
    with open(log_path, "ab") as out:
        out.write(f"\n=== vime: started at {time.strftime('%Y-%m-%d %H:%M:%S')}: {' '.join(cmd)[:300]}\n".encode())
        out.flush()
        proc = subprocess.Popen([sys.executable, "-m", "vime.procguard", "--", *cmd], stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=full_env,
                                start_new_session=True)
    _spawned.add(proc)
    return proc


def ask_all_to_stop() -> None:
    """SIGTERM every child `spawn` started here that still runs, waiting for none: each owner's own
    stop then waits on a process already on its way out, so a launch that ends stops its services
    (vLLM servers, router, Temporal) in the time of the slowest, not of all of them in a row."""
    for proc in list(_spawned):
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)


def stop_process_group(proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    """Ask `proc` (a guard, or any group leader) to stop with SIGTERM; SIGKILL its whole process
    group after `timeout` s — and at once if the leader is already dead, since its children
    (vLLM's engine core, say) may still be running."""
    stop_process_groups([proc], timeout)


def stop_process_groups(procs: Sequence[subprocess.Popen | None], timeout: float = 20.0) -> None:
    """`stop_process_group` for several at once: all are asked to stop before any is waited for,
    so stopping them takes as long as the slowest, not the sum (SIGTERM on a launch: issue 21)."""
    procs = [p for p in procs if p is not None]
    for proc in procs:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.0, deadline - time.monotonic()))
    for proc in procs:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5)


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for error messages ("(no log)" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])


_ERROR_LINE = re.compile(r"(^|\s)(\w+(Error|Exception)|error|Killed)\b:?", re.IGNORECASE)
_NOT_AN_ERROR = re.compile(r"\b(WARNING|WARN|INFO|DEBUG)\b|\"level\": \"(warning|info|debug)\"")


def last_error_line(path: str | Path) -> str | None:
    """The log's last line since the process's latest start that states an error (a Python
    exception, `error:`), for one-line reports; None when there is none. Warnings and info
    lines that merely mention an error are not errors."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    for line in reversed(text.rstrip().splitlines()[-300:]):
        s = line.strip()
        if s.startswith("=== vime: started"):
            return None  # only this start's lines count
        if not s or s.startswith(("File ", "^", "~")) or _NOT_AN_ERROR.search(s):
            continue
        if _ERROR_LINE.search(s):
            return s[:400]
    return None


def exit_cause(code: int | None, log_path: str | Path) -> str:
    """Why a child exited, in a few words: the signal that killed it, else its log's last error."""
    signum = -code if code is not None and code < 0 else (code - 128 if code is not None and code > 128 else None)
    if signum is not None:  # negative: the process itself was killed; above 128: the guard reports a kill
        try:
            return f"killed by {signal.Signals(signum).name}"
        except ValueError:
            return f"exit code {code}"
    return last_error_line(log_path) or f"exit code {code}"


def leftover_processes(run_dir: str | Path) -> list[int]:
    """Pids (not this process) whose environment says they belong to `run_dir`."""
    wanted = f"{RUN_DIR_ENV}={Path(run_dir).resolve()}".encode()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read().split(b"\0")
        except OSError:
            continue
        if wanted in env:
            pids.append(int(entry))
    return pids


def kill_leftovers(run_dir: str | Path, timeout: float = 10.0) -> list[int]:
    """SIGTERM, then SIGKILL, every leftover process of `run_dir`; returns the pids found."""
    pids = leftover_processes(run_dir)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (timeout if sig == signal.SIGTERM else 5)
        while time.monotonic() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.1)
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False
