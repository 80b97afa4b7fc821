"""A guard between the launcher and each process it starts, so nothing outlives either.

    python -m vime.procguard -- COMMAND [ARGS...]

The launcher starts every service (vLLM, the Temporal dev server, a router, the workers) through
this guard, in a session of its own. The guard:

- stops its command when its parent (the launcher) dies, so even a launcher killed with SIGKILL
  takes its services down. It watches `getppid()` rather than asking for `PR_SET_PDEATHSIG`:
  the kernel sends that signal when the parent *thread* exits, and the launcher starts servers
  from short-lived threads;
- becomes a child subreaper (`PR_SET_CHILD_SUBREAPER`), so processes the command leaves
  behind (vLLM's engine core when its API server dies, a sandbox a worker started) are
  reparented to the guard instead of to init;
- runs COMMAND, forwards SIGTERM/SIGINT to it, and when COMMAND exits (or does not exit within
  `VIME_GUARD_GRACE_S` seconds of a stop request) kills every process left in its session and
  every orphan it adopted, then exits with COMMAND's exit status (128 + signal if killed).

Only the standard library is imported: the guard must start in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
DEFAULT_GRACE_S = 20.0
POLL_S = 0.2


def _prctl(option: int, value: int) -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the guard still stops its command's session
        pass


def _die_with_parent() -> None:
    """In the command (between fork and exec): SIGKILL if the guard itself is killed."""
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _session_members(sid: int) -> list[int]:
    """Pids in session `sid` (the guard's: everything COMMAND started that did not setsid)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid or int(fields[1]) == os.getpid():  # session, or an adopted orphan
            pids.append(int(entry))
    return pids


def _kill_everything_left(sid: int) -> None:
    """SIGKILL the session and the adopted orphans until none is left (bounded), reaping them."""
    for _ in range(50):
        pids = _session_members(sid)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        _reap_all()
        time.sleep(0.05)


def _reap_all() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def run(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m vime.procguard -- COMMAND [ARGS...]", file=sys.stderr)
        return 2
    parent = os.getppid()
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    grace = float(os.environ.get("VIME_GUARD_GRACE_S", DEFAULT_GRACE_S))
    stop_at: list[float] = []

    def on_stop(signum, _frame) -> None:
        if not stop_at:
            stop_at.append(time.monotonic() + grace)
        try:
            child.send_signal(signal.SIGTERM if signum == signal.SIGTERM else signum)
        except (ProcessLookupError, NameError):
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_stop)
    child = subprocess.Popen(argv, preexec_fn=_die_with_parent)
    if stop_at:  # a stop request that came before the command existed
        child.send_signal(signal.SIGTERM)
    sid = os.getsid(0)
    status = None
    while status is None and not (stop_at and time.monotonic() >= stop_at[0]):
        if not stop_at and os.getppid() != parent:  # the launcher is gone: stop as if asked to
            on_stop(signal.SIGTERM, None)
        try:
            pid, raw = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == child.pid:
            status = raw
        elif pid == 0:  # polled rather than blocking: the grace period and the parent are watched
            time.sleep(POLL_S)
    _kill_everything_left(sid)
    if status is None:
        try:
            _, status = os.waitpid(child.pid, 0)
        except ChildProcessError:
            return 137
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def main() -> int:
    argv = sys.argv[1:]
    if argv and argv[0] == "--":
        argv = argv[1:]
    return run(argv)


if __name__ == "__main__":
    sys.exit(main())
