"""Child processes that vime starts (vLLM, Temporal, a router, workers): stopping them and
quoting their logs, done one way.

Every child starts in its own session (`start_new_session=True`), so it leads a process group:
stopping the group reaches the grandchildren too (vLLM's engine core, torch workers).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path


def stop_process_group(proc: subprocess.Popen | None, timeout: float = 20.0) -> None:
    """SIGTERM the process group of `proc`; SIGKILL whatever is left after `timeout` s."""
    if proc is None or proc.poll() is not None:
        return
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def log_tail(path: str | Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file, for error messages ("(no log)" if unreadable)."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:])
