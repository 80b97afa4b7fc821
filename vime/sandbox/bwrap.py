"""The local sandbox backend: bubblewrap over a private copy of the task repository.

Design: entering copies the repository into a fresh temp dir (the workdir); each `exec` runs a
fresh `bwrap` over that same workdir, so there is no long-lived container to die, leak or
restart, and all state the agent makes lives in the workdir (mounted at `/workspace`). Outside
it the sandbox sees only the host's system directories (`system_dirs`: /usr, /etc, /lib*, ...)
read-only plus the `ro_binds` asked for, never homes, checkouts or data trees; `/tmp` and
`/dev/shm` are private; every namespace is unshared (no network unless `network=True`), and the
command runs under `prlimit` (RLIMIT_CPU / RLIMIT_AS / RLIMIT_NPROC) plus a wall-clock timeout.

Every place a command can write has a size cap, because each would otherwise be host RAM or
disk without bound: `/` and `/dev` are read-only, `/tmp` and `/dev/shm` are tmpfs of
`tmp_bytes` / `shm_bytes`, and the workdir itself is a tmpfs of `workspace_bytes` mounted on
the host at boot (so a write past any cap fails with ENOSPC inside, and nothing outlives
`destroy`); a process that may not mount (not root) keeps it a plain, uncapped host directory
and logs one warning. The workdir is a host mount rather than a tmpfs of one bwrap because each `exec`
is a fresh bwrap and the workspace must persist between them (and be seen by every handle).
At most `max_concurrent` commands run at once per process and event loop (the others wait
before their clock starts), so a loaded host does not time out correct code.

Why the details matter:
- Running as root, bwrap itself is started as `run_as_uid` (default 65534, "nobody"): the kernel
  exempts uid 0 from RLIMIT_NPROC, so a fork bomb inside a root-owned sandbox would not be
  stopped. The limits are set inside the sandbox (after its user namespace exists) so that the
  process count is per sandbox, not shared by every sandbox of that uid.
- Each bwrap leads its own process group and `--die-with-parent` chains SIGKILL down to the
  sandbox's PID-namespace init, whose death kills every process in the sandbox; so killing the
  group reaps the whole tree, and a SIGKILLed worker leaves no process behind either.
- `--json-status-fd` tells a sandbox that failed to start (infra: `SandboxError`) from a
  command that exited non-zero (task data: `rc`).

Lifecycle across processes: the workdir's name `vime-sbx-<pid>-<hex>` holds the booting pid
(its owner) and the `<hex>` of `sandbox_id` (`bwrap-<hex>`), so `attach` finds it from the id
alone and `reap_stale_workdirs` knows whose it is. A sandbox has no state outside that
directory, so a handle in any process of the host is as good as the original; `destroy` from
any handle also SIGKILLs the bwraps other processes run over it (found by their argv in /proc).
A keyed sandbox (`boot_key`) has a `<hex>` that starts with 12 hex digits of the key's sha256
(then 8 random ones, so two boots of one key never share a directory name), which is how a
keyed `boot` finds and destroys the sandboxes of earlier attempts on this host by name alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import errno
import hashlib
import json
import logging
import os
import pwd
import shutil
import signal
import stat
import tempfile
import time
import uuid
import weakref
from pathlib import Path, PurePosixPath

from vime.sandbox.base import (
    WORKDIR,
    CommandFailed,
    CommandTimeout,
    ExecResult,
    SandboxError,
    SandboxGone,
    _show,
)
from vime.errors import ConfigError

_PREFIX = "vime-sbx-"
_TOMBSTONE = ".gone"
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
"""What of the host a sandbox sees by default (read-only): the runtime that python3, git, node
and a shell need. Not /home, /root, /work, /opt, /mnt, /srv, /var, /run, /sys or the host's
/tmp: add what a task needs on purpose with `ro_binds`."""
_SIGXCPU_RC = 128 + signal.SIGXCPU  # how bwrap reports a command killed by RLIMIT_CPU's soft limit
_MS_NOSUID, _MS_NODEV, _MNT_DETACH = 2, 4, 2
_libc = ctypes.CDLL(None, use_errno=True)
_warned_no_mount = False  # the workspace cap's fallback is logged once per process
log = logging.getLogger(__name__)
_slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # loop -> {cap: Semaphore}
_BASE_ENV = {
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
}


class BwrapSandbox:
    """A bubblewrap sandbox over a private copy of `repo_dir` (empty workdir if None).

    `cpu_seconds` / `memory_bytes` / `max_processes` bound each command (per process CPU time,
    address space, tasks in the sandbox); a process past `cpu_seconds` gets SIGXCPU (then
    SIGKILL a second later) and its result says `stopped_by="cpu_seconds"`. `wall_timeout` is the
    default `exec` timeout. `max_output_bytes` caps what is kept of each of stdout / stderr (the
    head). `tmp_bytes` / `shm_bytes` / `workspace_bytes` cap the private `/tmp`, `/dev/shm` and
    `/workspace`: all tmpfs, i.e. RAM that `memory_bytes` does not count. `workspace_bytes=None`
    leaves the workspace an uncapped host directory, as does a process that may not mount (not
    root: one warning per process); the others always have a cap. `max_concurrent` bounds the
    commands this process runs at once (default `default_max_concurrent()`: 4 per CPU core, at
    least 8), shared by the sandboxes made with the same value.
    `system_dirs` are the host directories visible read-only (top-level symlinks kept as links);
    `ro_binds` are further host paths made visible read-only at the same path (a tool installed
    outside them, e.g. a checkout's node_modules, needs one). These apply per handle: an
    attached handle's commands run under the kwargs it was attached with.
    `boot_key` makes `boot()` first destroy the sandboxes of this host booted with the same key
    (under the same `base_dir`), listing their ids in `replaced`.
    """

    def __init__(
        self,
        repo_dir: str | Path | None = None,
        *,
        network: bool = False,
        cpu_seconds: int = 600,
        memory_bytes: int = 8 << 30,
        max_processes: int = 512,
        wall_timeout: float = 1800.0,
        run_as_uid: int | None = 65534,
        base_dir: str | Path | None = None,
        env: dict[str, str] | None = None,
        max_output_bytes: int = 16 << 20,
        ro_binds: tuple[str | Path, ...] | list[str | Path] = (),
        boot_key: str | None = None,
        tmp_bytes: int = 256 << 20,
        shm_bytes: int = 64 << 20,
        workspace_bytes: int | None = 1 << 30,
        max_concurrent: int | None = None,
        system_dirs: tuple[str, ...] | list[str] = SYSTEM_DIRS,
    ):
        _check_caps(tmp_bytes=tmp_bytes, shm_bytes=shm_bytes, cpu_seconds=cpu_seconds,
                    workspace_bytes=workspace_bytes, max_concurrent=max_concurrent)
        self.repo_dir = Path(repo_dir) if repo_dir is not None else None
        self.ro_binds = tuple(str(Path(b).resolve()) for b in ro_binds)
        self.system_dirs = tuple(system_dirs)
        self.network = network
        self.cpu_seconds, self.memory_bytes = cpu_seconds, memory_bytes
        self.max_processes, self.wall_timeout = max_processes, wall_timeout
        self.run_as_uid = run_as_uid if os.geteuid() == 0 else None
        self.base_dir = base_dir
        self.env = dict(env or {})
        self.max_output_bytes = max_output_bytes
        self.boot_key = boot_key
        self.tmp_bytes, self.shm_bytes, self.workspace_bytes = tmp_bytes, shm_bytes, workspace_bytes
        self.max_concurrent = max_concurrent or default_max_concurrent()
        key_part = _key_hex(boot_key) if boot_key is not None else ""
        self.sandbox_id = f"bwrap-{key_part}{uuid.uuid4().hex[:8 if boot_key is not None else 12]}"
        self.replaced: list[str] = []
        self.root: Path | None = None
        self._procs: set[asyncio.subprocess.Process] = set()

    @property
    def workdir(self) -> Path:
        """The host directory mounted read-write at `/workspace` (a tmpfs of `workspace_bytes`)."""
        if self.root is None:
            raise SandboxError(f"sandbox {self.sandbox_id} is not running: boot() or attach() it")
        return self.root / "workspace"

    @classmethod
    async def attach(cls, sandbox_id: str, **kwargs) -> BwrapSandbox:
        """A handle to the running sandbox `sandbox_id`, booted by any process of this host;
        `kwargs` as for the booter (same `base_dir`). `SandboxGone` if its workdir is gone."""
        hex_id = _hex_of(sandbox_id)
        sbx = cls(**kwargs)
        sbx.sandbox_id = sandbox_id
        sbx._find_tools()
        base = Path(sbx.base_dir or tempfile.gettempdir())
        roots = [p for p in base.glob(f"{_PREFIX}*-{hex_id}") if (p / "workspace").is_dir()]
        if not roots:
            raise SandboxGone(sandbox_id, f"no workdir {_PREFIX}<pid>-{hex_id} under {base}")
        sbx.root = roots[0]
        return sbx

    async def boot(self) -> BwrapSandbox:
        """Create the workdir (a copy of `repo_dir`); it lives until `destroy()` or a reap."""
        self._find_tools()
        if self.root is not None:
            raise ConfigError(f"sandbox {self.sandbox_id} is already running; boot() it once")
        if self.repo_dir is not None and not self.repo_dir.is_dir():
            raise ConfigError(f"sandbox repo_dir {str(self.repo_dir)!r} is not a directory")
        base = Path(self.base_dir or tempfile.gettempdir())
        if self.boot_key is not None:
            await self._replace_keyed(base)
        root = base / f"{_PREFIX}{os.getpid()}-{_hex_of(self.sandbox_id)}"
        try:
            root.mkdir(mode=0o700)
        except OSError as e:
            raise SandboxError(f"sandbox {self.sandbox_id} could not start: {e}") from e
        self.root = root
        try:
            await asyncio.to_thread(self._populate)
        except BaseException as e:
            self.root = None
            _remove(root)
            if _no_space(e):
                raise SandboxError(
                    f"sandbox {self.sandbox_id} could not start: repo_dir {str(self.repo_dir)!r} does not "
                    f"fit in workspace_bytes={self.workspace_bytes}; raise it (--sandbox-workspace-mb)"
                ) from e
            if isinstance(e, Exception):
                raise SandboxError(f"sandbox {self.sandbox_id} could not start: {e}") from e
            raise
        return self

    async def destroy(self) -> None:
        """Kill every command running in this sandbox (from any handle) and remove the workdir.

        Idempotent; a no-op on a sandbox that never started or is already gone. The workdir is
        first renamed to a tombstone, so from that instant every handle's next (or running)
        command sees `SandboxGone` rather than a half-removed sandbox.
        """
        root, self.root = self.root, None
        if root is None:
            return
        tomb = root.with_name(root.name + _TOMBSTONE)
        with contextlib.suppress(FileNotFoundError):
            root.rename(tomb)
        try:
            for proc in list(self._procs):
                await _kill(proc)
                self._procs.discard(proc)
            await asyncio.shield(asyncio.to_thread(_kill_bwraps_over, root / "workspace"))
        finally:
            _remove(tomb)

    async def __aenter__(self) -> BwrapSandbox:
        return await self.boot()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.destroy()

    async def exec(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
        check: bool = False,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run `cmd` in a fresh bwrap over the workdir; see `Sandbox.exec`.

        It first waits for one of the process's `max_concurrent` slots; `timeout` counts from
        when it has one, so commands queued behind others are not failed by the wait.
        """
        self._check_alive()
        async with _slot(self.max_concurrent):
            return await self._exec(cmd, env, self.wall_timeout if timeout is None else timeout,
                                    user, check, cwd)

    async def _exec(self, cmd, env, timeout, user, check, cwd) -> ExecResult:
        self._check_alive()  # it may have been destroyed while this command waited for a slot
        argv = ["bash", "-c", cmd] if isinstance(cmd, str) else list(cmd)
        status_r, status_w = os.pipe()
        # Spawned as a task and shielded: cancelled mid-spawn, asyncio itself would kill bwrap
        # alone and then wait for its pipes, which the sandboxed command holds until it ends.
        spawn = asyncio.ensure_future(asyncio.create_subprocess_exec(
            *self._bwrap_argv(argv, user, cwd, status_w),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={**_BASE_ENV, **self.env, **(env or {})},
            start_new_session=True,
            pass_fds=(status_w,),
            **self._drop_privileges(),
        ))
        try:
            proc = await asyncio.shield(spawn)
        except asyncio.CancelledError:
            with contextlib.suppress(OSError):
                await _kill(await spawn)
            os.close(status_r)
            raise
        except OSError as e:
            os.close(status_r)
            raise SandboxError(f"sandbox {self.sandbox_id}: cannot run bwrap: {e}") from e
        finally:
            os.close(status_w)
        self._procs.add(proc)
        out, err = bytearray(), bytearray()
        try:
            try:
                done = asyncio.gather(self._drain(proc.stdout, out), self._drain(proc.stderr, err), proc.wait())
                done.add_done_callback(_retrieve)  # cancelled by wait_for: nobody else reads it
                await asyncio.wait_for(done, timeout)
            except asyncio.TimeoutError:
                await _kill(proc)
                raise CommandTimeout(cmd, timeout, _text(out), _text(err)) from None
        except BaseException:
            await _kill(proc)
            raise
        finally:
            self._procs.discard(proc)
            status = _read_status(status_r)
        if "exit-code" not in status:
            if self.root is None or not self.root.exists():
                raise SandboxGone(self.sandbox_id, f"destroyed while {_show(cmd)!r} ran")
            raise SandboxError(
                f"sandbox {self.sandbox_id} failed to start the command (bwrap rc {proc.returncode}"
                f"): {_text(err).strip()[-500:]}"
            )
        rc = status["exit-code"]
        result = ExecResult(rc, _text(out), _text(err), "cpu_seconds" if rc == _SIGXCPU_RC else None)
        if check and result.rc != 0:
            raise CommandFailed(cmd, result)
        return result

    async def write_file(self, path: str, data: str | bytes) -> None:
        host = self._host_path(path)
        payload = data.encode() if isinstance(data, str) else data

        def write() -> None:
            self._make_parents(host.parent)
            fd = os.open(host, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            self._own(host)

        await asyncio.to_thread(write)

    async def read_file(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError if it does not exist."""
        host = self._host_path(path)

        def read() -> bytes:
            fd = os.open(host, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                return f.read()

        return await asyncio.to_thread(read)

    async def copy_in(self, local_dir: str | Path, sandbox_dir: str) -> None:
        """Copy the contents of `local_dir` into `sandbox_dir` (merged; symlinks kept as links)."""
        dest = self._host_path(sandbox_dir)

        def copy() -> None:
            self._make_parents(dest)
            shutil.copytree(local_dir, dest, symlinks=True, dirs_exist_ok=True)
            self._own_tree(dest)

        await asyncio.to_thread(copy)

    async def copy_out(self, sandbox_dir: str, local_dir: str | Path) -> None:
        """Copy `sandbox_dir` to `local_dir`; links stay links, so nothing outside leaks out."""
        src = self._host_path(sandbox_dir)
        await asyncio.to_thread(shutil.copytree, src, local_dir, symlinks=True, dirs_exist_ok=True)

    # -- internals -------------------------------------------------------------------------

    async def _replace_keyed(self, base: Path) -> None:
        """Destroy the sandboxes under `base` booted with this `boot_key` (by any process):
        an earlier attempt of this boot left them. Their commands die with them."""
        pattern = f"{_PREFIX}*-{_key_hex(self.boot_key)}{'[0-9a-f]' * 8}"
        for root in sorted(base.glob(pattern)):
            old = BwrapSandbox(base_dir=base, run_as_uid=self.run_as_uid)
            old.sandbox_id, old.root = f"bwrap-{root.name.rsplit('-', 1)[1]}", root
            await old.destroy()
            self.replaced.append(old.sandbox_id)

    def _find_tools(self) -> None:
        self._bwrap = shutil.which("bwrap")
        self._prlimit = shutil.which("prlimit")
        if not self._bwrap or not self._prlimit:
            raise SandboxError(
                "bwrap sandbox needs `bwrap` and `prlimit` on PATH: apt-get install -y bubblewrap"
            )

    def _check_alive(self) -> None:
        """SandboxGone if another handle destroyed it (or a reap removed it) since we looked."""
        if not self.workdir.parent.is_dir():
            raise SandboxGone(self.sandbox_id, f"its directory {self.root} no longer exists")

    def _bwrap_argv(self, argv: list[str], user: str | int | None, cwd: str | None, fd: int):
        args = [self._bwrap, "--unshare-all", "--die-with-parent", "--new-session"]
        if self.network:
            args += ["--share-net", *_resolver_binds()]
        args += _system_binds(self.system_dirs)
        for path in self.ro_binds:  # host paths a task needs on purpose: visible, read-only
            args += ["--ro-bind", path, path]
        # every writable mount is capped: a tmpfs is RAM that RLIMIT_AS does not count
        args += ["--size", str(self.tmp_bytes), "--tmpfs", "/tmp", "--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(self.shm_bytes), "--tmpfs", "/dev/shm", "--remount-ro", "/dev"]
        args += ["--bind", str(self.workdir), WORKDIR, "--remount-ro", "/", "--chdir", cwd or WORKDIR]
        if user is not None:
            uid = _uid(user)
            args += ["--unshare-user", "--uid", str(uid), "--gid", str(uid)]
        args += ["--json-status-fd", str(fd), "--", self._prlimit]
        # the soft limit's SIGXCPU makes a result that says so; the hard one, a second later, SIGKILLs
        args += [f"--cpu={self.cpu_seconds}:{self.cpu_seconds + 1}", f"--as={self.memory_bytes}"]
        args += [f"--nproc={self.max_processes}", "--", *argv]
        return args

    def _drop_privileges(self) -> dict:
        if self.run_as_uid is None:
            return {}
        return {"user": self.run_as_uid, "group": self.run_as_uid, "extra_groups": []}

    async def _drain(self, stream: asyncio.StreamReader, buf: bytearray) -> None:
        while chunk := await stream.read(1 << 16):
            room = self.max_output_bytes - len(buf)
            if room > 0:
                buf += chunk[:room]

    def _host_path(self, path: str) -> Path:
        """The host path of a sandbox path, refusing anything outside the workdir."""
        self._check_alive()
        full = PurePosixPath(WORKDIR, path)
        if ".." in full.parts or not (full == PurePosixPath(WORKDIR) or full.is_relative_to(WORKDIR)):
            raise ConfigError(
                f"sandbox path {path!r}: only paths under {WORKDIR} can be read or written"
            )
        host = self.workdir / full.relative_to(WORKDIR)
        real_work = os.path.realpath(self.workdir)
        if os.path.commonpath([real_work, os.path.realpath(host)]) != real_work:
            raise ConfigError(f"sandbox path {path!r} leads outside {WORKDIR} through a symlink")
        return host

    def _populate(self) -> None:
        self.workdir.mkdir()
        if self.workspace_bytes is not None:
            _mount_workspace(self.workdir, self.workspace_bytes, self.run_as_uid)
        if self.repo_dir is not None:
            shutil.copytree(self.repo_dir, self.workdir, symlinks=True, dirs_exist_ok=True)
        self._own_tree(self.root)

    def _make_parents(self, path: Path) -> None:
        """Create `path` and its missing parents inside the workdir, never the workdir itself
        (so a write racing a `destroy` fails instead of resurrecting the sandbox)."""
        missing = [p for p in [path, *path.parents] if p.is_relative_to(self.workdir)]
        for p in reversed(missing[:-1]):
            if not p.exists():
                p.mkdir(exist_ok=True)
                self._own(p)

    def _own(self, path: Path) -> None:
        if self.run_as_uid is not None:
            os.lchown(path, self.run_as_uid, self.run_as_uid)

    def _own_tree(self, top: Path) -> None:
        if self.run_as_uid is None:
            return
        self._own(top)
        for dirpath, dirnames, filenames in os.walk(top):
            for name in dirnames + filenames:
                self._own(Path(dirpath, name))



def default_max_concurrent() -> int:
    """4 commands per CPU core of this process, at least 8. Most sandboxed commands of an agent
    wait (on I/O, a model, a sleeping test), and a long one holds its slot, so one per core would
    queue a worker's concurrent rollouts behind each other; the bound is against a pile-up that
    makes every command's wall clock run out, not against sharing cores."""
    return max(8, 4 * len(os.sched_getaffinity(0)))


def flag_options(args: object) -> dict:
    """`BwrapSandbox` kwargs from the run's `--sandbox-*` limit flags (their defaults where `args`
    lacks them, e.g. a test's namespace); a bad value is a ConfigError naming its flag."""
    mib = {name: getattr(args, f"sandbox_{name}_mb", default)
           for name, default in (("workspace", 1024), ("tmp", 256), ("shm", 64))}
    cpu = getattr(args, "sandbox_cpu_seconds", 600)
    concurrent = getattr(args, "sandbox_max_concurrent", 0)
    for flag, value, least in (("--sandbox-workspace-mb", mib["workspace"], 0), ("--sandbox-tmp-mb", mib["tmp"], 1),
                               ("--sandbox-shm-mb", mib["shm"], 1), ("--sandbox-cpu-seconds", cpu, 1),
                               ("--sandbox-max-concurrent", concurrent, 0)):
        if value < least:
            raise ConfigError(f"{flag} {value}: must be at least {least}")
    return dict(workspace_bytes=(mib["workspace"] << 20) or None, tmp_bytes=mib["tmp"] << 20,
                shm_bytes=mib["shm"] << 20, cpu_seconds=cpu, max_concurrent=concurrent or None)


def _key_hex(boot_key: str) -> str:
    """12 hex digits naming a boot key in workdir names (any string is a key; names stay short)."""
    return hashlib.sha256(boot_key.encode()).hexdigest()[:12]


def _hex_of(sandbox_id: str) -> str:
    prefix, _, hex_id = sandbox_id.partition("-")
    if prefix != "bwrap" or not hex_id or any(c not in "0123456789abcdef" for c in hex_id):
        raise ConfigError(f"sandbox id {sandbox_id!r} is not a bwrap sandbox id (bwrap-<hex>)")
    return hex_id


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


def _system_binds(system_dirs: tuple[str, ...]) -> list[str]:
    """The allow-listed host directories read-only (symlinks, e.g. /bin -> usr/bin, recreated);
    the ones this host lacks are skipped, so one list serves merged-/usr and older layouts."""
    args: list[str] = []
    for path in system_dirs:
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.exists(path):
            args += ["--ro-bind", path, path]
    return args


def _resolver_binds() -> list[str]:
    """With the network on, DNS needs /etc/resolv.conf's target, which systemd hosts keep in /run."""
    return ["--ro-bind-try", "/run/systemd/resolve", "/run/systemd/resolve"]


def _check_caps(**caps: int | None) -> None:
    """Every cap a positive integer; only `workspace_bytes` and `max_concurrent` may be None."""
    for name, value in caps.items():
        if value is None and name in ("workspace_bytes", "max_concurrent"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"sandbox {name}={value!r}: must be a positive integer (every writable "
                              "mount and every command needs a bound)")


def _slot(cap: int) -> asyncio.Semaphore:
    """The semaphore of `cap` commands shared by this event loop's sandboxes made with `cap`.

    Per loop, since an asyncio semaphore belongs to one; a worker runs one loop, so per process.
    """
    per_loop = _slots.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault(cap, asyncio.Semaphore(cap))


def _mount_tmpfs(path: Path, size: int, uid: int | None) -> None:
    """Mount a tmpfs of `size` bytes at `path`; inodes are bounded too (each costs kernel memory)."""
    opts = f"size={size},nr_inodes={max(size // 4096, 1024)},mode=0755"
    if uid is not None:
        opts += f",uid={uid},gid={uid}"
    if _libc.mount(b"vime-sbx", os.fsencode(path), b"tmpfs", _MS_NOSUID | _MS_NODEV, opts.encode()):
        code = ctypes.get_errno()
        raise OSError(code, f"mount tmpfs {opts}: {os.strerror(code)}", str(path))


def _mount_workspace(path: Path, size: int, uid: int | None) -> None:
    """The workspace's capped tmpfs; where this process may not mount (not root, no
    CAP_SYS_ADMIN: the mount itself fails with EPERM) it stays a plain, uncapped host directory,
    as before the cap, and the first such boot of the process logs one warning saying why."""
    global _warned_no_mount
    try:
        _mount_tmpfs(path, size, uid)
    except PermissionError as e:
        if not _warned_no_mount:
            _warned_no_mount = True
            log.warning("sandbox workspace_bytes=%d (--sandbox-workspace-mb) not applied, /workspace is "
                        "an uncapped host directory: not root: the workspace cap needs mount "
                        "permission (CAP_SYS_ADMIN; mount: %s)", size, e.strerror)


def _unmount(path: Path) -> None:
    """Detach the workspace's tmpfs if `path` is one; its memory is freed once no process uses it."""
    if os.path.ismount(path) and _libc.umount2(os.fsencode(path), _MNT_DETACH):
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):
            raise OSError(code, f"umount: {os.strerror(code)}", str(path))


def _no_space(e: BaseException) -> bool:
    """ENOSPC, also inside the list of per-file errors that `shutil.copytree` raises at its end."""
    if isinstance(e, shutil.Error) and e.args and isinstance(e.args[0], list):
        return any(os.strerror(errno.ENOSPC) in str(item[-1]) for item in e.args[0])
    return isinstance(e, OSError) and e.errno == errno.ENOSPC


def _remove(root: Path) -> None:
    """Remove a sandbox's directory, its workspace's mount first (rmtree cannot remove a mount)."""
    _unmount(root / "workspace")
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


def reap_stale_workdirs(base_dir: str | Path | None = None) -> list[Path]:
    """Destroy sandboxes whose booting process no longer exists (a worker killed with SIGKILL
    cannot clean up after itself); returns the workdirs it removed. Safe at worker start.

    The booter owns a sandbox: once it is dead and reaped, `attach` to that id raises
    `SandboxGone`, and a workflow resumes the session in a fresh sandbox from its stored diff.
    """
    removed = []
    for path in Path(base_dir or tempfile.gettempdir()).glob(f"{_PREFIX}*"):
        name = path.name.removesuffix(_TOMBSTONE)  # a tombstone: its destroyer died midway
        pid = name[len(_PREFIX) :].split("-", 1)[0]
        if name != path.name or (pid.isdigit() and not Path(f"/proc/{pid}").exists()):
            _kill_bwraps_over(path.with_name(name) / "workspace")
            _remove(path)
            removed.append(path)
    return removed
