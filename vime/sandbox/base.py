"""The provider-neutral sandbox contract that rollouts depend on.

A rollout only ever sees `Sandbox`: boot it (`async with`), run commands, move files, and let
the context manager tear it down. Backends (bubblewrap here, E2B in the cloud, Docker / Modal /
a VM elsewhere) differ in how they isolate, never in what the caller sees.

A sandbox can also outlive the code that booted it, because a Temporal workflow spreads one
agent session over several activities (maybe several worker processes): one `boot()`s it and
records `sandbox_id`, later ones `attach()` to that id, the last one `destroy()`s it. A sandbox
that no longer exists is `SandboxGone`, the workflow's cue to boot a fresh one and resume from
its stored diff (`vime.sandbox.git`).

The booting activity can itself be retried after it booted (its worker died before reporting,
or the report was lost). So a sandbox can be made with a `boot_key`, the same for every attempt
of one boot: `boot()` first destroys any sandbox booted under that key (that the backend can
reach: the host for a local backend, the account for a cloud one), so a retried boot leaves
one sandbox, not one per attempt.

Errors are split by who is to blame, because rollouts treat them differently:

- `SandboxError` is infrastructure (the sandbox could not start, died, or its provider is
  unreachable). It subclasses `ServiceError`, so a rollout marks the sample as an infra failure
  and keeps it out of advantage statistics.
- `CommandTimeout` / `CommandFailed` are the command's own outcome (the agent ran something
  slow or broken): ordinary task data, an ordinary low reward.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from vime.errors import ServiceError, VimeError

WORKDIR = "/workspace"
"""Where the task repository lives inside every sandbox; relative paths are resolved here."""


@dataclass(frozen=True)
class ExecResult:
    """What a command returned. Unpacks as `rc, stdout, stderr` for terse call sites.

    `stopped_by` names the backend limit that ended it, when the backend can tell (bwrap:
    "cpu_seconds" for a process that ran past its CPU time), so a caller can say why.
    """

    rc: int
    stdout: str
    stderr: str
    stopped_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def __iter__(self) -> Iterator:
        return iter((self.rc, self.stdout, self.stderr))


class SandboxError(ServiceError):
    """The sandbox itself failed (could not start, died, provider unreachable): infra, not task."""


class SandboxGone(SandboxError):
    """The sandbox no longer exists (destroyed, reaped, expired): retrying cannot help, a fresh
    one (restored from the session's stored diff) can. Infra, like every `SandboxError`."""

    def __init__(self, sandbox_id: str, detail: str = "it was destroyed, reaped or expired"):
        super().__init__(f"sandbox {sandbox_id} is gone: {detail}; boot a new one")
        self.sandbox_id = sandbox_id


class CommandError(VimeError):
    """A command ran in a healthy sandbox and did not succeed: task data, not infra."""


class CommandTimeout(CommandError):
    """A command ran past its timeout; the whole process tree it started was killed."""

    def __init__(self, cmd: str | list[str], timeout: float, stdout: str = "", stderr: str = ""):
        super().__init__(f"command timed out after {timeout:g} s: {_show(cmd)}")
        self.cmd, self.timeout, self.stdout, self.stderr = cmd, timeout, stdout, stderr


class CommandFailed(CommandError):
    """`exec(..., check=True)` saw a non-zero exit status; `result` holds its output."""

    def __init__(self, cmd: str | list[str], result: ExecResult):
        tail = (result.stderr or result.stdout).strip()[-500:]
        super().__init__(f"command exited with {result.rc}: {_show(cmd)}\n{tail}".rstrip())
        self.cmd, self.result = cmd, result


def _show(cmd: str | list[str]) -> str:
    text = cmd if isinstance(cmd, str) else " ".join(cmd)
    return text if len(text) <= 200 else text[:200] + "..."


@runtime_checkable
class Sandbox(Protocol):
    """An isolated machine-like place where an agent edits a repository and runs commands.

    Invariants every backend keeps:
    - `boot()` starts it with the task repository at `WORKDIR`; `destroy()` kills every process
      it started and removes everything, is idempotent, and works from any handle;
    - made with `boot_key=K`, `boot()` first destroys every sandbox it can reach that was booted
      with `K` and lists their ids in `replaced` (empty otherwise): one sandbox per key;
    - `async with` is `boot()` + `destroy()`: leaving the block (normally, on an exception or on
      cancellation) destroys it, always;
    - `attach(sandbox_id, **same constructor kwargs)` returns a handle to a running sandbox
      booted by any process (of the host, for local backends); a handle behaves like the
      original. An id that no longer exists raises `SandboxGone`;
    - `exec` runs `cmd` (a string goes to `bash -c`; a list is an argv) in `WORKDIR` (or `cwd`),
      with no network unless the backend was asked for it, and under the backend's limits;
    - a command's failure is returned (`rc != 0`) or raised as `CommandError`; only a broken
      sandbox raises `SandboxError`;
    - paths are sandbox paths: absolute, or relative to `WORKDIR`.
    """

    sandbox_id: str
    replaced: list[str]

    @classmethod
    async def attach(cls, sandbox_id: str, **kwargs: object) -> Sandbox: ...

    async def boot(self) -> Sandbox: ...

    async def destroy(self) -> None: ...

    async def __aenter__(self) -> Sandbox: ...

    async def __aexit__(self, *exc_info: object) -> None: ...

    async def exec(
        self,
        cmd: str | list[str],
        *,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        user: str | int | None = None,
        check: bool = False,
        cwd: str | None = None,
    ) -> ExecResult: ...

    async def write_file(self, path: str, data: str | bytes) -> None: ...

    async def read_file(self, path: str) -> bytes: ...

    async def copy_in(self, local_dir: str | Path, sandbox_dir: str) -> None: ...

    async def copy_out(self, sandbox_dir: str, local_dir: str | Path) -> None: ...
