"""The E2B backend: the same `Sandbox` contract over an E2B (or E2B-compatible) cloud sandbox.

The `e2b` SDK is imported when a sandbox is entered, not when vime is, so vime runs without it.
Isolation and limits are the provider's (a Firecracker microVM per sandbox, sized by the
template); this class maps the SDK's outcomes onto vime's error classes: a non-zero exit is
`rc`, a command timeout is `CommandTimeout`, anything else from the SDK (auth, quota, the VM
gone) is `SandboxError`, i.e. infra. The VM is killed on exit, always; `lifetime` (the VM's own
timeout in seconds) bounds what a crashed worker can leak.

`attach` is the SDK's `AsyncSandbox.connect`: any process holding the API key can reach a
sandbox by id, and each attach renews its lifetime. A VM that was killed or expired is
`SandboxGone`, whether noticed on attach or on a later command.

A keyed VM (`boot_key`) carries the key in its E2B metadata (`BOOT_KEY_METADATA`); a keyed
`boot` first lists the account's VMs with that metadata (`AsyncSandbox.list`, filtered by the
provider) and kills them: what an earlier attempt of the same boot left, from any machine.
"""

from __future__ import annotations

import asyncio
import io
import shlex
import tarfile
from pathlib import Path, PurePosixPath
from typing import Any

from vime.sandbox.base import (
    WORKDIR,
    CommandFailed,
    CommandTimeout,
    ExecResult,
    SandboxError,
    SandboxGone,
)
from vime.errors import ConfigError

BOOT_KEY_METADATA = "vime_boot_key"
"""The E2B metadata field holding a keyed VM's `boot_key`."""


def _sdk() -> Any:
    try:
        import e2b
    except ImportError as e:
        raise SandboxError("--sandbox-backend e2b needs the e2b SDK: pip install e2b") from e
    return e2b


class E2BSandbox:
    """An E2B sandbox with `repo_dir` (if given) copied to `/workspace`.

    `template` is the E2B template id or name (its image holds the toolchain the tasks need);
    `api_key` defaults to the SDK's `E2B_API_KEY` environment variable; `network=False` asks the
    provider to deny internet access. `boot_key` makes `boot()` first kill the account's VMs
    booted with the same key, listing their ids in `replaced`. `sdk` replaces the `e2b` module
    (tests pass a fake).
    """

    def __init__(
        self,
        repo_dir: str | Path | None = None,
        *,
        template: str | None = None,
        network: bool = False,
        lifetime: int = 3600,
        wall_timeout: float = 1800.0,
        api_key: str | None = None,
        env: dict[str, str] | None = None,
        boot_key: str | None = None,
        sdk: Any = None,
    ):
        self.repo_dir = Path(repo_dir) if repo_dir is not None else None
        self.template, self.network, self.lifetime = template, network, lifetime
        self.wall_timeout, self.api_key, self.env = wall_timeout, api_key, dict(env or {})
        self.boot_key = boot_key
        self.replaced: list[str] = []
        self._sdk_override = sdk
        self._sbx: Any = None
        self.sandbox_id = "e2b-(not started)"

    @classmethod
    async def attach(cls, sandbox_id: str, **kwargs: Any) -> E2BSandbox:
        """A handle to the running VM `sandbox_id` (`e2b-<provider id>`), from any process.

        `kwargs` are the constructor's (`repo_dir` is ignored). Raises `SandboxGone` if the
        provider no longer knows the VM.
        """
        if not sandbox_id.startswith("e2b-"):
            raise ConfigError(f"sandbox id {sandbox_id!r} is not an e2b sandbox id (e2b-<id>)")
        sbx = cls(**kwargs)
        sbx._e2b = sbx._sdk_override or _sdk()
        opts: dict[str, Any] = {"timeout": sbx.lifetime}
        if sbx.api_key:
            opts["api_key"] = sbx.api_key
        try:
            sbx._sbx = await sbx._e2b.AsyncSandbox.connect(sandbox_id.removeprefix("e2b-"), **opts)
        except sbx._e2b.NotFoundException as e:
            raise SandboxGone(sandbox_id, f"the provider does not know it ({e})") from e
        except Exception as e:
            raise SandboxError(f"e2b sandbox {sandbox_id} could not be attached: {e}") from e
        sbx.sandbox_id = sandbox_id
        return sbx

    async def boot(self) -> E2BSandbox:
        """Create the VM and copy `repo_dir` in; it lives until `destroy()` or `lifetime`."""
        if self._sbx is not None:
            raise ConfigError(f"sandbox {self.sandbox_id} is already running; boot() it once")
        self._e2b = self._sdk_override or _sdk()
        if self.boot_key is not None:
            await self._replace_keyed()
        opts: dict[str, Any] = {"template": self.template, "timeout": self.lifetime}
        opts["envs"] = self.env or None
        opts["allow_internet_access"] = self.network
        if self.boot_key is not None:
            opts["metadata"] = {BOOT_KEY_METADATA: self.boot_key}
        if self.api_key:
            opts["api_key"] = self.api_key
        try:
            self._sbx = await self._e2b.AsyncSandbox.create(**opts)
        except Exception as e:
            raise SandboxError(f"e2b sandbox (template {self.template!r}) could not start: {e}") from e
        self.sandbox_id = f"e2b-{self._sbx.sandbox_id}"
        try:
            await self.exec(["mkdir", "-p", WORKDIR], check=True, user="root", cwd="/")
            await self.exec(["chmod", "a+rwx", WORKDIR], check=True, user="root", cwd="/")
            if self.repo_dir is not None:
                await self.copy_in(self.repo_dir, WORKDIR)
        except BaseException:
            await self.destroy()
            raise
        return self

    async def destroy(self) -> None:
        """Kill the VM (with every process in it). Idempotent; works from any handle."""
        sbx, self._sbx = self._sbx, None
        if sbx is not None:
            try:
                await asyncio.shield(sbx.kill())
            except Exception:
                pass  # its lifetime timeout reclaims it; a teardown must not mask the real error

    async def __aenter__(self) -> E2BSandbox:
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
        sbx = self._running()
        timeout = self.wall_timeout if timeout is None else timeout
        line = cmd if isinstance(cmd, str) else shlex.join(cmd)
        try:
            done = await sbx.commands.run(
                line,
                envs=env,
                user=None if user is None else str(user),
                cwd=cwd or WORKDIR,
                timeout=timeout,
            )
            result = ExecResult(done.exit_code, done.stdout, done.stderr)
        except self._e2b.CommandExitException as e:
            result = ExecResult(e.exit_code, e.stdout, e.stderr)
        except self._gone_errors() as e:
            raise SandboxGone(self.sandbox_id, str(e)) from e
        except self._e2b.TimeoutException as e:
            raise CommandTimeout(cmd, timeout) from e
        except Exception as e:
            raise SandboxError(f"sandbox {self.sandbox_id} failed running {line[:200]!r}: {e}") from e
        if check and result.rc != 0:
            raise CommandFailed(cmd, result)
        return result

    async def write_file(self, path: str, data: str | bytes) -> None:
        await self._files_call("write", _abs(path), data)

    async def read_file(self, path: str) -> bytes:
        """The file's bytes; FileNotFoundError if it does not exist."""
        try:
            return bytes(await self._files_call("read", _abs(path), format="bytes"))
        except SandboxError as e:
            if isinstance(e.__cause__, self._e2b.FileNotFoundException):
                raise FileNotFoundError(path) from e
            raise

    async def copy_in(self, local_dir: str | Path, sandbox_dir: str) -> None:
        """One tar upload and one extract: a repository is thousands of files."""
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w:gz") as tar:
            tar.add(str(local_dir), arcname=".")
        archive = f"/tmp/vime-in-{id(buf)}.tar.gz"
        await self._files_call("write", archive, buf.getvalue())
        dest = _abs(sandbox_dir)
        await self.exec(f"mkdir -p {shlex.quote(dest)} && tar -xzf {archive} -C "
                        f"{shlex.quote(dest)} && rm -f {archive}", check=True)

    async def copy_out(self, sandbox_dir: str, local_dir: str | Path) -> None:
        archive = f"/tmp/vime-out-{id(self)}.tar.gz"
        src = _abs(sandbox_dir)
        await self.exec(f"tar -czf {archive} -C {shlex.quote(src)} .", check=True)
        data = await self._files_call("read", archive, format="bytes")
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        with tarfile.open(fileobj=io.BytesIO(bytes(data)), mode="r:gz") as tar:
            tar.extractall(local_dir, filter="data")  # no absolute paths, no escaping links

    async def _replace_keyed(self) -> None:
        """Kill the account's VMs booted with this `boot_key` (an earlier attempt of this boot)."""
        auth = {"api_key": self.api_key} if self.api_key else {}
        query = self._e2b.SandboxQuery(metadata={BOOT_KEY_METADATA: self.boot_key})
        try:
            pages = self._e2b.AsyncSandbox.list(query=query, **auth)
            found = []
            while pages.has_next:
                found += [info.sandbox_id for info in await pages.next_items()]
            for provider_id in found:
                await self._e2b.AsyncSandbox.kill(provider_id, **auth)
                self.replaced.append(f"e2b-{provider_id}")
        except Exception as e:
            raise SandboxError(f"e2b boot key {self.boot_key!r}: could not list or kill the VMs an earlier "
                               f"attempt booted ({e}); check the API key and the provider's status") from e

    def _running(self) -> Any:
        if self._sbx is None:
            raise SandboxError(f"sandbox {self.sandbox_id} is not running: boot() or attach() it")
        return self._sbx

    def _gone_errors(self) -> tuple[type[BaseException], ...]:
        """The SDK's "this VM no longer exists" errors (checked before its TimeoutException,
        which `SandboxNotRunningException` subclasses: a dead VM is not a slow command)."""
        names = ("SandboxNotFoundException", "SandboxNotRunningException")
        return tuple(getattr(self._e2b, n) for n in names if hasattr(self._e2b, n))

    async def _files_call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        sbx = self._running()
        try:
            return await getattr(sbx.files, method)(*args, **kwargs)
        except self._gone_errors() as e:
            raise SandboxGone(self.sandbox_id, str(e)) from e
        except Exception as e:
            raise SandboxError(f"sandbox {self.sandbox_id}: files.{method}{args[:1]} failed: {e}") from e


def _abs(path: str) -> str:
    return str(PurePosixPath(WORKDIR, path))
