"""`E2BSandbox` against `FakeE2BSdk`, a FAKE of the e2b SDK boundary (the E2B cloud is not
reachable here). The fake mirrors the SDK surface vime uses (`AsyncSandbox.create` / `.connect`
/ `.list` with its paginator and `SandboxQuery` metadata filter, `.commands.run`,
`.files.read/write`, `.kill` on a VM or by id, the exception classes) and runs commands on the
host in a scratch root where `/workspace` and `/tmp` are rewritten: enough to test vime's
mapping of results and errors, not isolation (that is E2B's job; see docs/sandbox-backends.md).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
import types
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from vime.sandbox import (
    CommandFailed,
    CommandTimeout,
    E2BSandbox,
    SandboxError,
    SandboxGone,
    attach_sandbox,
    make_sandbox,
)
from vime.config.args import VimeArgs
from vime.envs.coding_agent.sandbox_activities import SandboxActivities
from vime.sandbox.e2b import BOOT_KEY_METADATA
from vime.sandbox.git import capture_diff, init_base, restore_diff
from vime.errors import ConfigError
from vime.store import SampleStore
from vime.envs.coding_agent.workflow import AgentTask, BootInput, SandboxRef


class _FakeCommandExitException(Exception):
    def __init__(self, stderr, stdout, exit_code, error):
        super().__init__(error)
        self.stderr, self.stdout, self.exit_code, self.error = stderr, stdout, exit_code, error


class _FakeTimeoutException(Exception):
    pass


class _FakeNotFoundException(Exception):
    pass


class _FakeSandboxNotFoundException(_FakeNotFoundException):
    pass


class _FakeFileNotFoundException(_FakeNotFoundException):
    pass


@dataclass
class _FakeSandboxQuery:
    metadata: dict[str, str] | None = None
    state: list[str] | None = None


@dataclass
class _FakeSandboxInfo:
    sandbox_id: str
    metadata: dict[str, str] = field(default_factory=dict)


class _FakePaginator:
    """The SDK's `AsyncSandboxPaginator`: `has_next` is True until the last page was fetched."""

    def __init__(self, items: list[_FakeSandboxInfo], limit: int):
        self._items, self._limit, self.has_next = items, limit, True

    async def next_items(self) -> list[_FakeSandboxInfo]:
        if not self.has_next:
            raise Exception("No more items to fetch")
        page, self._items = self._items[:self._limit], self._items[self._limit:]
        self.has_next = bool(self._items)
        return page


class _FakeKill:
    """The SDK's `class_method_variant`: `await vm.kill()` kills that VM, `await
    AsyncSandbox.kill(sandbox_id)` the VM with that id; True if it was running."""

    def __get__(self, vm, cls):
        async def kill(sandbox_id=None, **_):
            return cls.live.pop(vm.sandbox_id if vm is not None else sandbox_id, None) is not None
        return kill


class _FakeSandbox:
    live: dict[str, "_FakeSandbox"] = {}
    fail_create = False
    page_size = 100  # the provider's default (and maximum) page

    def __init__(self, root: Path, opts: dict):
        self.sandbox_id, self.root, self.opts = uuid.uuid4().hex[:8], root, opts
        self.metadata = dict(opts.get("metadata") or {})
        (root / "tmp").mkdir(parents=True)
        self.commands = types.SimpleNamespace(run=self._run)
        self.files = types.SimpleNamespace(read=self._read, write=self._write)
        self.runs: list[dict] = []
        self.connects: list[dict] = []

    @classmethod
    async def create(cls, **opts):
        if cls.fail_create:
            raise RuntimeError("401: invalid API key")
        sbx = cls(Path(opts.pop("_root_factory")()), opts) if "_root_factory" in opts else None
        cls.live[sbx.sandbox_id] = sbx
        return sbx

    @classmethod
    def list(cls, query=None, limit=None, next_token=None, **opts):
        wanted = (query.metadata if query is not None else None) or {}
        found = [_FakeSandboxInfo(vm.sandbox_id, dict(vm.metadata)) for vm in cls.live.values()
                 if all(vm.metadata.get(k) == v for k, v in wanted.items())]
        return _FakePaginator(found, limit or cls.page_size)

    @classmethod
    async def connect(cls, sandbox_id, timeout=None, **opts):
        if sandbox_id not in cls.live:
            raise _FakeSandboxNotFoundException(f"404: sandbox {sandbox_id} not found")
        sbx = cls.live[sandbox_id]
        sbx.connects.append({"timeout": timeout, **opts})
        return sbx

    def _check_live(self):
        if self.sandbox_id not in self.live:
            raise _FakeSandboxNotFoundException(f"404: sandbox {self.sandbox_id} not found")

    def _map(self, text: str) -> str:
        return re.sub(r"(?<![\w./-])/(workspace|tmp)\b", lambda m: f"{self.root}/{m[1]}", text)

    async def _run(self, cmd, envs=None, user=None, cwd=None, timeout=60, **_):
        self._check_live()
        self.runs.append({"cmd": cmd, "envs": envs, "user": user, "cwd": cwd, "timeout": timeout})
        try:
            done = subprocess.run(["bash", "-c", self._map(cmd)], cwd=self._map(cwd) if cwd else None,
                                  env={"PATH": "/usr/bin:/bin", **(envs or {})}, capture_output=True,
                                  text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise _FakeTimeoutException(f"context deadline exceeded after {timeout}") from e
        if done.returncode != 0:
            raise _FakeCommandExitException(done.stderr, done.stdout, done.returncode, "exit status")
        return types.SimpleNamespace(exit_code=0, stdout=done.stdout, stderr=done.stderr, error=None)

    async def _read(self, path, format="text", **_):
        self._check_live()
        try:
            data = Path(self._map(path)).read_bytes()
        except FileNotFoundError as e:
            raise _FakeFileNotFoundException(path) from e
        return bytearray(data) if format == "bytes" else data.decode()

    async def _write(self, path, data, **_):
        self._check_live()
        target = Path(self._map(path))
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data.encode() if isinstance(data, str) else data)

    kill = _FakeKill()


def FakeE2BSdk(tmp_path: Path) -> types.SimpleNamespace:
    """A fake `e2b` module whose sandboxes live under `tmp_path`."""
    counter = iter(range(1000))

    class AsyncSandbox(_FakeSandbox):
        live = {}

        @classmethod
        async def create(cls, **opts):
            return await super().create(_root_factory=lambda: tmp_path / f"vm{next(counter)}", **opts)

    return types.SimpleNamespace(
        AsyncSandbox=AsyncSandbox,
        SandboxQuery=_FakeSandboxQuery,
        CommandExitException=_FakeCommandExitException,
        TimeoutException=_FakeTimeoutException,
        NotFoundException=_FakeNotFoundException,
        SandboxNotFoundException=_FakeSandboxNotFoundException,
        FileNotFoundException=_FakeFileNotFoundException,
    )


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    (tmp_path / "repo" / "pkg").mkdir(parents=True)
    (tmp_path / "repo" / "pkg" / "mod.py").write_text("X = 1\n")
    return tmp_path / "repo"


async def test_round_trips_and_teardown(repo: Path, tmp_path: Path) -> None:
    sdk = FakeE2BSdk(tmp_path / "cloud")
    sb = make_sandbox("e2b", repo_dir=repo, template="vime-python", sdk=sdk)
    assert isinstance(sb, E2BSandbox)
    async with sb:
        assert sb.sandbox_id.startswith("e2b-")
        vm = next(iter(sdk.AsyncSandbox.live.values()))
        assert vm.opts["template"] == "vime-python" and vm.opts["allow_internet_access"] is False
        rc, out, _ = await sb.exec("cat pkg/mod.py")
        assert (rc, out) == (0, "X = 1\n") and vm.runs[-1]["cwd"] == "/workspace"
        assert tuple(await sb.exec(["sh", "-c", "echo oops >&2; exit 4"])) == (4, "", "oops\n")
        with pytest.raises(CommandFailed, match="exited with 4"):
            await sb.exec("exit 4", check=True)
        with pytest.raises(CommandTimeout):
            await sb.exec("sleep 5", timeout=0.2)
        await sb.exec("true", user="root", env={"A": "1"})
        assert vm.runs[-1]["user"] == "root" and vm.runs[-1]["envs"] == {"A": "1"}

        await sb.write_file("notes.txt", "hi")
        assert await sb.read_file("/workspace/notes.txt") == b"hi"
        with pytest.raises(FileNotFoundError):
            await sb.read_file("missing")
        (tmp_path / "local" / "d").mkdir(parents=True)
        (tmp_path / "local" / "d" / "f").write_text("in")
        await sb.copy_in(tmp_path / "local", "incoming")
        await sb.exec("echo out > incoming/g", check=True)
        await sb.copy_out("/workspace", tmp_path / "back")
        assert (tmp_path / "back" / "incoming" / "d" / "f").read_text() == "in"
        assert (tmp_path / "back" / "incoming" / "g").read_text() == "out\n"
        assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "X = 1\n"
    assert sdk.AsyncSandbox.live == {}
    with pytest.raises(SandboxError, match="not running"):
        await sb.exec("true")


async def test_boot_attach_destroy_across_handles(repo: Path, tmp_path: Path) -> None:
    """One activity boots, another attaches by id (`AsyncSandbox.connect`), a third destroys."""
    sdk = FakeE2BSdk(tmp_path / "cloud")
    booted = await E2BSandbox(repo, sdk=sdk, lifetime=600).boot()
    await booted.exec("echo from-boot > state.txt", check=True)

    handle = await attach_sandbox("e2b", booted.sandbox_id, sdk=sdk, lifetime=600)
    assert isinstance(handle, E2BSandbox) and handle is not booted
    assert handle.sandbox_id == booted.sandbox_id
    vm = sdk.AsyncSandbox.live[booted.sandbox_id.removeprefix("e2b-")]
    assert vm.connects == [{"timeout": 600}]  # attaching renews the VM's lifetime
    assert await handle.read_file("state.txt") == b"from-boot\n"
    await handle.write_file("more.txt", "from-handle")
    assert (await booted.exec("cat more.txt")).stdout == "from-handle"

    await handle.destroy()
    assert sdk.AsyncSandbox.live == {}
    await handle.destroy()  # idempotent
    with pytest.raises(SandboxGone, match=booted.sandbox_id):
        await booted.exec("true")  # the original handle learns on its next command
    with pytest.raises(SandboxGone, match=booted.sandbox_id):
        await booted.read_file("state.txt")
    await booted.destroy()
    with pytest.raises(SandboxGone, match=f"{booted.sandbox_id} is gone"):
        await E2BSandbox.attach(booted.sandbox_id, sdk=sdk)
    with pytest.raises(ConfigError, match="not an e2b sandbox id"):
        await E2BSandbox.attach("bwrap-0123", sdk=sdk)


async def test_git_diff_round_trip_over_e2b(repo: Path, tmp_path: Path) -> None:
    """`vime.sandbox.git` only uses the `Sandbox` contract, so it works on this backend too."""
    sdk = FakeE2BSdk(tmp_path / "cloud")
    async with E2BSandbox(repo, sdk=sdk) as sb:
        await init_base(sb)
        await sb.exec("echo 'X = 2' > pkg/mod.py && printf '\\000\\377' > blob.bin", check=True)
        diff = await capture_diff(sb)
    assert "+X = 2" in diff and "GIT binary patch" in diff
    async with E2BSandbox(repo, sdk=sdk) as fresh:
        await init_base(fresh)
        await restore_diff(fresh, diff)
        assert await fresh.read_file("pkg/mod.py") == b"X = 2\n"
        assert await fresh.read_file("blob.bin") == b"\x00\xff"
        assert await capture_diff(fresh) == diff


async def test_killed_on_exception_and_cancel(repo: Path, tmp_path: Path) -> None:
    sdk = FakeE2BSdk(tmp_path / "cloud")
    with pytest.raises(RuntimeError, match="boom"):
        async with E2BSandbox(repo, sdk=sdk):
            raise RuntimeError("boom")
    assert sdk.AsyncSandbox.live == {}

    started = asyncio.Event()

    async def rollout() -> None:
        async with E2BSandbox(repo, sdk=sdk):
            started.set()
            await asyncio.sleep(300)

    task = asyncio.create_task(rollout())
    await started.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sdk.AsyncSandbox.live == {}


async def test_provider_failures_are_infra(repo: Path, tmp_path: Path) -> None:
    sdk = FakeE2BSdk(tmp_path / "cloud")
    sdk.AsyncSandbox.fail_create = True
    with pytest.raises(SandboxError, match="could not start: 401"):
        async with E2BSandbox(repo, sdk=sdk):
            pass
    sdk.AsyncSandbox.fail_create = False
    async with E2BSandbox(repo, sdk=sdk) as sb:
        async def vm_gone(*a, **k):
            raise ConnectionError("sandbox not found")

        sb._sbx.commands.run = vm_gone
        with pytest.raises(SandboxError, match="sandbox not found"):
            await sb.exec("true")


async def test_a_keyed_boot_kills_the_vms_an_earlier_attempt_of_the_same_boot_left(repo: Path, tmp_path: Path) -> None:
    """A retried boot (same key) finds the VMs of earlier attempts by their metadata, through
    every page of the provider's list, and kills them: one VM per key afterwards."""
    sdk = FakeE2BSdk(tmp_path / "cloud")
    sdk.AsyncSandbox.page_size = 1
    first = await E2BSandbox(repo, sdk=sdk, boot_key="wf-1/boot-0").boot()
    # and one that a second, overlapping attempt created before it was abandoned
    overlapping = await sdk.AsyncSandbox.create(metadata={BOOT_KEY_METADATA: "wf-1/boot-0"})
    other_key = await E2BSandbox(repo, sdk=sdk, boot_key="wf-1/boot-1").boot()
    unkeyed = await E2BSandbox(repo, sdk=sdk).boot()
    assert [vm.metadata for vm in sdk.AsyncSandbox.live.values()] == [
        {BOOT_KEY_METADATA: "wf-1/boot-0"}, {BOOT_KEY_METADATA: "wf-1/boot-0"}, {BOOT_KEY_METADATA: "wf-1/boot-1"}, {}]

    earlier = [first, await E2BSandbox.attach(f"e2b-{overlapping.sandbox_id}", sdk=sdk)]
    retry = await E2BSandbox(repo, sdk=sdk, boot_key="wf-1/boot-0").boot()
    assert sorted(retry.replaced) == sorted(sb.sandbox_id for sb in earlier)
    keyed = [f"e2b-{vm.sandbox_id}" for vm in sdk.AsyncSandbox.live.values()
             if vm.metadata.get(BOOT_KEY_METADATA) == "wf-1/boot-0"]
    assert keyed == [retry.sandbox_id]
    assert len(sdk.AsyncSandbox.live) == 3  # the other key's VM and the unkeyed one are left alone
    for gone in earlier:
        with pytest.raises(SandboxGone):
            await gone.exec("true")
    assert (await other_key.exec("cat pkg/mod.py")).stdout == "X = 1\n" and (await unkeyed.exec("true")).ok
    assert unkeyed.replaced == [] and other_key.replaced == []
    for sb in (retry, other_key, unkeyed):
        await sb.destroy()
    assert sdk.AsyncSandbox.live == {}


async def test_a_provider_that_cannot_list_fails_a_keyed_boot_as_infra(repo: Path, tmp_path: Path) -> None:
    sdk = FakeE2BSdk(tmp_path / "cloud")

    def refuse(*a, **k):
        raise RuntimeError("403: listing is not allowed for this key")

    sdk.AsyncSandbox.list = refuse
    with pytest.raises(SandboxError, match="boot key 'wf/boot-0'.*403"):
        await E2BSandbox(repo, sdk=sdk, boot_key="wf/boot-0").boot()
    assert sdk.AsyncSandbox.live == {}  # nothing was created


async def test_boot_sandbox_run_twice_with_one_key_leaves_one_vm(repo: Path, tmp_path: Path, monkeypatch) -> None:
    """The `boot_sandbox` activity retried after a boot whose completion was lost: the retry
    kills the first attempt's VM; the ref names this worker's own queue."""
    from temporalio.testing import ActivityEnvironment

    sdk = FakeE2BSdk(tmp_path / "cloud")
    monkeypatch.setitem(sys.modules, "e2b", sdk)  # what `import e2b` gets: the fake SDK
    args = VimeArgs(sandbox_backend="e2b", sandbox_task_queue="sbx")
    task = AgentTask("0", 0, 0, "fix it", str(repo), "true")
    with SampleStore.open(tmp_path / "run") as store:
        acts = SandboxActivities(args, store, host_queue="sbx-host-1")
        env = ActivityEnvironment()
        first = await env.run(acts.boot_sandbox, BootInput(task, "wf-7/boot-0"))
        retry = await env.run(acts.boot_sandbox, BootInput(task, "wf-7/boot-0"))
        assert first.task_queue == retry.task_queue == "sbx-host-1"
        assert first.sandbox_id != retry.sandbox_id
        assert [f"e2b-{i}" for i in sdk.AsyncSandbox.live] == [retry.sandbox_id]
        assert set(acts.booted) == {retry.sandbox_id}
        assert await env.run(acts.teardown_sandbox, SandboxRef(retry.sandbox_id, retry.task_queue))
    assert sdk.AsyncSandbox.live == {}


def test_missing_sdk_is_a_clear_error(monkeypatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "e2b", None)
    from vime.sandbox.e2b import _sdk

    with pytest.raises(SandboxError, match="pip install e2b"):
        _sdk()
