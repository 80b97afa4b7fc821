"""What a bwrap sandbox may take from its host: the mounts and limits `bwrap.py` applies.

One job, kept apart from `bwrap.py` (which runs commands and owns a sandbox's lifecycle) so that
module stays under the project's ~600-line rule and the caps read in one place: the host
allow-list (`SYSTEM_DIRS` and the bind arguments for it), the workspace's capped tmpfs mounted
and unmounted on the host (with its fallback to an uncapped directory where the process may not
mount), the `prlimit` arguments (RLIMIT_CPU / RLIMIT_AS / RLIMIT_NPROC), the per-process
concurrency limiter, the caps' validation and the `--sandbox-*` flags that set them.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import os
import shutil
import signal
import weakref
from pathlib import Path

from vime.errors import ConfigError
from vime.procs import usable_cores

SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""What of the host a sandbox sees by default (read-only): the runtime that python3, git, node
and a shell need. Not /home, /root, /work, /opt, /mnt, /srv, /var, /run, /sys or the host's
/tmp: add what a task needs on purpose with `ro_binds`."""
SIGXCPU_RC = 128 + signal.SIGXCPU  # how bwrap reports a command killed by RLIMIT_CPU's soft limit
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)
_warned_no_mount = False  # the workspace cap's fallback is logged once per process
log = logging.getLogger(__name__)
_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {cap: Semaphore}


def prlimit_args(prlimit: str, cpu_seconds: int, memory_bytes: int, max_processes: int) -> list[str]:
    """`prlimit` and its limits, run inside the sandbox (after its user namespace exists, so the
    process count is per sandbox); the soft CPU limit's SIGXCPU makes a result that says so, the
    hard one, a second later, SIGKILLs."""
    return [prlimit, f"--cpu={cpu_seconds}:{cpu_seconds + 1}", f"--as={memory_bytes}",
            f"--nproc={max_processes}", "--"]


def system_binds(system_dirs: tuple[str, ...]) -> list[str]:
    """The allow-listed host directories read-only (symlinks, e.g. /bin -> usr/bin, recreated);
    the ones this host lacks are skipped, so one list serves merged-/usr and older layouts."""
    args: list[str] = []
    for path in system_dirs:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def private_mounts(tmp_bytes: int, shm_bytes: int, workdir: str, workspace: str) -> list[str]:
    """The sandbox's own writable mounts, each capped (a tmpfs is RAM that RLIMIT_AS does not
    count): `/tmp` and `/dev/shm` fresh tmpfs, the host `workdir` at `workspace`, on a fresh /proc
    and /dev. The caller remounts /dev read-only after these and any binds below them."""
    return ["--size", str(tmp_bytes), "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev",
            "--size", str(shm_bytes), "--tmpfs", "/dev/shm", "--bind", workdir, workspace]


def check_binds(paths: tuple[str, ...], workspace: str) -> None:
    """No bind may cover a private mount: binding the host's /tmp (or /, or /dev) over the
    sandbox's own would lift its cap and show every other sandbox's workdir."""
    private = ("/tmp", "/dev", "/dev/shm", "/proc", workspace)
    for path in paths:
        covered = [m for m in private if m == path or m.startswith(path.rstrip("/") + "/")]
        if covered:
            raise ConfigError(f"sandbox ro_binds {path!r}: covers the sandbox's own {covered[0]}; bind "
                              "the directories under it a task needs instead")


def host_binds(paths: tuple[str, ...]) -> list[str]:
    """Host paths a task needs on purpose (`ro_binds`), read-only at the same path. bwrap mounts
    in argument order, so these go after `private_mounts`: a path under /tmp (a checkout CI
    cloned to /tmp/ciN holding Claude Code's node_modules) would be covered by the private /tmp
    otherwise."""
    args: list[str] = []
    for path in paths:
        args += ["--ro-bind", path, path]
    return args


def resolver_binds() -> list[str]:
    """With the network on, DNS needs /etc/resolv.conf's target, which systemd hosts keep in /run."""
    return ["--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]


def check_caps(**caps: int | None) -> None:
    """Every cap a positive integer; only `workspace_bytes` and `max_concurrent` may be None."""
    for name, value in caps.items():
        if value is None and name in ("workspace_bytes", "max_concurrent"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"sandbox {name}={value!r}: must be a positive integer (every writable "
                              "mount and every command needs a bound)")


def default_max_concurrent() -> int:
    """4 commands per CPU core of this process, at least 8. Most sandboxed commands of an agent
    wait (on I/O, a model, a sleeping test), and a long one holds its slot, so one per core would
    queue a worker's concurrent rollouts behind each other; the bound is against a pile-up that
    makes every command's wall clock run out, not against sharing cores."""
    return max(8, 4 * usable_cores())


def slot(cap: int) -> asyncio.Semaphore:
    """The semaphore of `cap` commands shared by this event loop's sandboxes made with `cap`.

    Per loop, since an asyncio semaphore belongs to one; a worker runs one loop, so per process.
    """
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(cap, asyncio.Semaphore(cap))


def mount_tmpfs(path: Path, size: int, uid: int | None) -> None:
    """Mount a tmpfs of `size` bytes at `path`; inodes are bounded too (each costs kernel memory)."""
    opts = f"size={size},nr_inodes={max(size // 4096, 1024)},mode=0755"
    if uid is not None:
        opts += f",uid={uid},gid={uid}"
    if _libc.mount(b"vime-sbx", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()):
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs {opts}: {os.strerror(code)}", str(path))


def mount_workspace(path: Path, size: int, uid: int | None) -> None:
    """The workspace's capped tmpfs; where this process may not mount (not root, no
    CAP_SYS_ADMIN: the mount itself fails with EPERM) it stays a plain, uncapped host directory,
    as before the cap, and the first such boot of the process logs one warning saying why."""
    global _warned_no_mount
    try:
        mount_tmpfs(path, size, uid)
    except PermissionError as e:
        if not _warned_no_mount:
            _warned_no_mount = True
            log.warning("sandbox workspace_bytes=%d (--sandbox-workspace-mb) not applied, /workspace is "
                        "an uncapped host directory: not root: the workspace cap needs mount "
                        "permission (CAP_SYS_ADMIN; mount: %s)", size, e.strerror)


def unmount(path: Path) -> None:
    """Detach the workspace's tmpfs if `path` is one; its memory is freed once no process uses it."""
    if os.path.ismount(path) and _libc.umount2(os.fsencode(path), _MNT_DETACH):
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, f"umount: {os.strerror(code)}", str(path))


def no_space(e: BaseException) -> bool:
    """ENOSPC, also inside the list of per-file errors that `shutil.copytree` raises at its end."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list):
        return any(os.strerror(errno.ENOSPC) in str(item[-1]) for item in e.args[0])
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def flag_options(args: object) -> dict:
    """`BwrapSandbox` kwargs from the run's `--sandbox-*` limit flags; a bad value is a ConfigError
    naming its flag."""
    mib = {"workspace": args.sandbox_workspace_mb, "tmp": args.sandbox_tmp_mb, "shm": args.sandbox_shm_mb}
    cpu = args.sandbox_cpu_seconds
    concurrent = args.sandbox_max_concurrent
    for flag, value, least in (("--sandbox-workspace-mb", mib["workspace"], 0), ("--sandbox-tmp-mb", mib["tmp"], 1),
                               ("--sandbox-shm-mb", mib["shm"], 1), ("--sandbox-cpu-seconds", cpu, 1),
                               ("--sandbox-max-concurrent", concurrent, 0)):
        if value < least:
            raise ConfigError(f"{flag} {value}: must be at least {least}")
    return dict(workspace_bytes=(mib["workspace"] << 20) or None, tmp_bytes=mib["tmp"] << 20,
                shm_bytes=mib["shm"] << 20, cpu_seconds=cpu, max_concurrent=concurrent or None)
