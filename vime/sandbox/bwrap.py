"""The local sandbox backend: bubblewrap over a private copy of the task repository.

Design: entering copies the repository into a fresh temp dir (the workdir); each `exec` runs a
fresh `bwrap` over that same workdir, so there is no long-lived container to die, leak or
restart, and all state the agent makes lives in the workdir (mounted at `/workspace`). Outside
it the sandbox sees only the host's system directories (`system_dirs`: /usr, /etc, /lib*, ...)
read-only plus the `ro_binds` asked for, never homes, checkouts or data trees; `/tmp` and
`/dev/shm` are private; every namespace is unshared (no network unless `network=True`), and the
command runs under `prlimit` (RLIMIT_CPU / RLIMIT_AS / RLIMIT_NPROC) plus a wall-clock timeout.

Every place a command can write has a size cap (host RAM or disk otherwise): `/` and `/dev`
are read-only, `/tmp`, `/dev/shm` and the workdir are tmpfs of `tmp_bytes` / `shm_bytes` /
`workspace_bytes` (the workdir's mounted on the host at boot, so it persists between the fresh
bwraps; uncapped, with one warning, where the process may not mount), and at most
`max_concurrent` commands run at once per process, their clocks started once they have a slot.
Those mounts and limits live in `bwrap_limits.py`.

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
import hashlib
import os
import shutil
import tempfile
import uuid
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
from vime.sandbox.bwrap_procs import (  # processes and workdirs on the host
    _kill_bwraps_over, _kill, _retrieve, _read_status, _remove, _uid, _text,
)
from vime.sandbox.bwrap_limits import (  # the mounts and limits: what a sandbox may take from its host
    SIGXCPU_RC, SYSTEM_DIRS, check_binds, check_caps, default_max_concurrent, host_binds,
    mount_workspace, no_space, prlimit_args, private_mounts, resolver_binds, slot, system_binds,
)

_PREFIX = "vime-sbx-"
_TOMBSTONE = ".gone"
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
    outside them, e.g. a checkout's node_modules, needs one), mounted over the private ones so a
    path under /tmp stays visible; one that would cover /tmp, /dev, /proc or /workspace whole is
    refused. These apply per handle: an attached handle's commands run under the kwargs it was
    attached with.
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
        check_caps(tmp_bytes=tmp_bytes, shm_bytes=shm_bytes, cpu_seconds=cpu_seconds,
                    workspace_bytes=workspace_bytes, max_concurrent=max_concurrent)
        self.repo_dir = Path(repo_dir) if repo_dir is not None else None
        self.ro_binds = tuple(str(Path(b).resolve()) for b in ro_binds)
        check_binds(self.ro_binds, WORKDIR)
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
            if no_space(e):
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
        async with slot(self.max_concurrent):
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
        result = ExecResult(rc, _text(out), _text(err), "cpu_seconds" if rc == SIGXCPU_RC else None)
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
            args += ["--share-net", *resolver_binds()]
        args += system_binds(self.system_dirs)
        args += private_mounts(self.tmp_bytes, self.shm_bytes, str(self.workdir), WORKDIR)
        args += host_binds(self.ro_binds)  # after the private mounts, which would cover them
        args += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", cwd or WORKDIR]
        if user is not None:
            uid = _uid(user)
            args += ["--unshare-user", "--uid", str(uid), "--gid", str(uid)]
        args += ["--json-status-fd", str(fd), "--"]
        args += prlimit_args(self._prlimit, self.cpu_seconds, self.memory_bytes, self.max_processes)
        return args + argv

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
            mount_workspace(self.workdir, self.workspace_bytes, self.run_as_uid)
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


def _key_hex(boot_key: str) -> str:
    """12 hex digits naming a boot key in workdir names (any string is a key; names stay short)."""
    return hashlib.sha256(boot_key.encode()).hexdigest()[:12]


def _hex_of(sandbox_id: str) -> str:
    prefix, _, hex_id = sandbox_id.partition("-")
    if prefix != "bwrap" or not hex_id or any(c not in "0123456789abcdef" for c in hex_id):
        raise ConfigError(f"sandbox id {sandbox_id!r} is not a bwrap sandbox id (bwrap-<hex>)")
    return hex_id


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
