"""The bubblewrap backend's processes and files on the host: find and kill the bwraps over a
workdir (any process's), kill one command's whole tree, read bwrap's `--json-status-fd`, and
remove a workdir even where the sandboxed command made it read-only. No sandbox state: plain
functions over pids, fds and paths, used by `bwrap.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pwd
import shutil
import signal
import stat
import time
from pathlib import Path

from vime.errors import ConfigError
from vime.sandbox.bwrap_limits import unmount


def _kill_bwraps_over(workdir: Path, grace: float = 5.0) -> None:
    """SIGKILL every bwrap binding `workdir` (any process's `exec`) until none is left.

    Killing a bwrap takes its PID namespace, i.e. the whole command tree, with it. Scanning
    again until a scan finds none catches a bwrap forked just after the previous scan, and
    keeps a dying command from writing into the workdir while it is being removed.
    """
    target = str(workdir).encode()
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        pids = []
        for entry in filter(str.isdigit, os.listdir("/proc")):
            try:
                argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if os.path.basename(argv[0]) == b"bwrap" and target in argv and _alive(int(entry)):
                pids.append(int(entry))
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


def _alive(pid: int) -> bool:
    """Running, not a zombie waiting for its parent to reap it."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _stat(pid: int | str) -> list[str]:
    """/proc/PID/stat's fields after the command name (state, ppid, ...); [] if it is gone."""
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return []


async def _kill(proc: asyncio.subprocess.Process) -> None:
    """SIGKILL bwrap and the sandbox's PID-namespace init, whose death kills every command in it.

    `--die-with-parent` alone leaves a window: a bwrap killed right after it forked the init
    (before the init armed its parent-death signal) left the command running, and since that
    command holds the output pipes, `proc.wait()` blocked until it ended (1 cancel in 100, 3 ms
    after the spawn, in a drill of `test_a_cancel_the_instant_bwrap_starts_...`).
    So bwrap is stopped first (it can fork no more), its children are killed by pid, then it.
    """
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGSTOP)
        for child in _children(proc.pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(child, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    await asyncio.shield(proc.wait())


def _retrieve(future: asyncio.Future) -> None:
    """Mark a future's outcome as seen (asyncio logs an unread exception as an error)."""
    if not future.cancelled():
        future.exception()


def _children(pid: int) -> list[int]:
    """The pids whose parent is `pid` (the sandbox's init lives in another session)."""
    return [int(e) for e in filter(str.isdigit, os.listdir("/proc")) if _stat(e)[1:2] == [str(pid)]]


def _read_status(fd: int) -> dict:
    """Merge the JSON documents bwrap wrote to --json-status-fd (non-blocking; closes fd)."""
    os.set_blocking(fd, False)
    data = b""
    with contextlib.suppress(BlockingIOError):
        while chunk := os.read(fd, 1 << 16):
            data += chunk
    os.close(fd)
    status: dict = {}
    decoder, text, i = json.JSONDecoder(), data.decode(errors="replace"), 0
    while (i := _skip_ws(text, i)) < len(text):
        try:
            doc, i = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        status.update(doc)
    return status


def _skip_ws(text: str, i: int) -> int:
    return len(text) - len(text[i:].lstrip())


def _remove(root: Path) -> None:
    """Remove a sandbox's directory, its workspace's mount first (rmtree cannot remove a mount)."""
    unmount(root / "workspace")
    _rmtree(root)


def _uid(user: str | int) -> int:
    if isinstance(user, int):
        return user
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ConfigError(f"sandbox user {user!r}: no such user in /etc/passwd") from None


def _text(buf: bytes | bytearray) -> str:
    return bytes(buf).decode(errors="replace")


def _rmtree(path: Path) -> None:
    """Remove a workdir even where the sandboxed command made directories read-only.

    Idempotent (another handle may be removing it too), and it never chmods anything above
    `path`: a failure on `path` itself must not touch its parent (`/tmp`).
    """

    def retry(func, p, exc_info) -> None:
        if isinstance(exc_info[1], FileNotFoundError):
            return
        with contextlib.suppress(OSError):
            if os.fspath(p) != os.fspath(path):
                os.chmod(os.path.dirname(p), stat.S_IRWXU)
            os.chmod(p, stat.S_IRWXU)
        with contextlib.suppress(FileNotFoundError):
            func(p)

    shutil.rmtree(path, onerror=retry)
