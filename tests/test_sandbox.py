"""The bubblewrap sandbox, for real: round trips, isolation, limits, and that nothing is left
behind (no process, no temp dir) however the `async with` ends."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import uuid
from pathlib import Path

import pytest

from vime.sandbox import (
    BwrapSandbox,
    CommandFailed,
    CommandTimeout,
    ExecResult,
    Sandbox,
    SandboxError,
    make_sandbox,
)
from vime.errors import ConfigError, ServiceError
from vime.sandbox.bwrap_limits import unmount

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

LIMITS = dict(cpu_seconds=2, memory_bytes=1 << 30, max_processes=64, wall_timeout=30.0)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "README").write_text("hello\n")
    return root


def _processes_mentioning(marker: str) -> list[int]:
    """Pids whose command line contains `marker` (bwrap's argv holds the workdir path)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            pids.append(int(entry))
    return pids


async def _assert_gone(root: Path, marker: str) -> None:
    assert not root.exists(), f"workdir {root} left behind"
    # killed processes are reaped synchronously by __aexit__; a short grace covers /proc lag
    for _ in range(50):
        left = _processes_mentioning(str(root)) + _processes_mentioning(marker)
        if not left:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"processes left behind: {left}")


async def test_registry_and_protocol(repo: Path) -> None:
    sb = make_sandbox("bwrap", repo_dir=repo)
    assert isinstance(sb, BwrapSandbox) and isinstance(sb, Sandbox)
    assert sb.sandbox_id.startswith("bwrap-")
    with pytest.raises(ConfigError, match="unknown backend"):
        make_sandbox("nope")
    assert issubclass(SandboxError, ServiceError)


async def test_exec_and_file_round_trips(repo: Path, tmp_path: Path) -> None:
    async with BwrapSandbox(repo, **LIMITS) as sb:
        rc, out, err = await sb.exec("cat README && pwd")
        assert (rc, out, err) == (0, "hello\n/workspace\n", "")
        res = await sb.exec(["sh", "-c", "echo $FOO >&2; exit 3"], env={"FOO": "bar"})
        assert res == ExecResult(3, "", "bar\n") and not res.ok
        with pytest.raises(CommandFailed, match="exited with 3") as info:
            await sb.exec("exit 3", check=True)
        assert info.value.result.rc == 3
        assert (await sb.exec("pwd", cwd="/workspace/pkg")).stdout == "/workspace/pkg\n"

        await sb.write_file("notes/a.txt", "from host")
        await sb.write_file("/workspace/bin.dat", b"\x00\xff")
        assert (await sb.exec("cat notes/a.txt")).stdout == "from host"
        await sb.exec("echo made-inside > pkg/new.txt", check=True)
        assert await sb.read_file("pkg/new.txt") == b"made-inside\n"
        assert await sb.read_file("/workspace/bin.dat") == b"\x00\xff"
        with pytest.raises(FileNotFoundError):
            await sb.read_file("missing.txt")
        with pytest.raises(ConfigError, match="only paths under /workspace"):
            await sb.read_file("/etc/passwd")
        with pytest.raises(ConfigError, match="only paths under /workspace"):
            await sb.write_file("../escape.txt", "x")
        await sb.exec("ln -s /etc leak", check=True)
        with pytest.raises(ConfigError, match="symlink"):
            await sb.read_file("leak/passwd")

        local = tmp_path / "local"
        (local / "sub").mkdir(parents=True)
        (local / "sub" / "f.txt").write_text("in")
        await sb.copy_in(local, "incoming")
        assert (await sb.exec("cat incoming/sub/f.txt && echo out > incoming/g.txt")).stdout == "in"
        await sb.copy_out("/workspace", tmp_path / "back")
        assert (tmp_path / "back" / "incoming" / "g.txt").read_text() == "out\n"
        assert (tmp_path / "back" / "pkg" / "mod.py").read_text() == "X = 1\n"
        assert (tmp_path / "back" / "leak").is_symlink()  # copied as a link, not /etc's files
    assert (repo / "README").read_text() == "hello\n" and not (repo / "notes").exists()


async def test_user_switch(repo: Path) -> None:
    async with BwrapSandbox(repo, **LIMITS) as sb:
        assert (await sb.exec("id -u", user="root")).stdout == "0\n"
        assert (await sb.exec("id -u", user=1000)).stdout == "1000\n"
        with pytest.raises(ConfigError, match="no such user"):
            await sb.exec("true", user="no-such-user-xyz")


async def test_no_network_and_no_dns(repo: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    probe = (
        "import socket\n"
        f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
        "print('connected')\n"
    )
    try:
        async with BwrapSandbox(repo, **LIMITS) as sb:
            res = await sb.exec(["python3", "-c", probe])
            assert res.rc != 0 and "connected" not in res.stdout
            assert "ConnectionRefused" in res.stderr or "unreachable" in res.stderr.lower()
            dns = await sb.exec(["python3", "-c", "import socket; socket.getaddrinfo('example.com', 80)"])
            assert dns.rc != 0 and "gaierror" in dns.stderr
            ifaces = await sb.exec("tail -n +3 /proc/net/dev | cut -d: -f1")
            assert ifaces.stdout.split() in ([], ["lo"])
        async with BwrapSandbox(repo, network=True, **LIMITS) as sb:
            assert (await sb.exec(["python3", "-c", probe])).stdout == "connected\n"
    finally:
        listener.close()


async def test_writes_outside_workdir_fail(repo: Path) -> None:
    async with BwrapSandbox(repo, **LIMITS) as sb:
        for target in ("/etc/vime-test", "/usr/vime-test", "/work/vime-test", "/root/vime-test"):
            res = await sb.exec(f"echo x > {target}")
            assert res.rc != 0, target
            assert not Path(target).exists()
        private = await sb.exec("echo x > /tmp/scratch && cat /tmp/scratch")
        assert private.stdout == "x\n"
    assert not Path("/tmp/scratch").exists()


async def test_fork_bomb_is_stopped_by_process_limit(repo: Path) -> None:
    bomb = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while n < 10000:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as e:\n"
        "    print('stopped after', n)\n"
    )
    async with BwrapSandbox(repo, **LIMITS) as sb:
        res = await sb.exec(["python3", "-c", bomb], timeout=20)
        assert res.stdout.startswith("stopped after"), res
        assert int(res.stdout.split()[-1]) < LIMITS["max_processes"]
        # the classic shell bomb returns too, and its leftovers die with the sandbox
        res = await sb.exec(":(){ :|:& };:", timeout=20)
        assert (await sb.exec("echo alive")).stdout == "alive\n"


async def test_endless_loop_is_stopped_by_cpu_limit(repo: Path) -> None:
    async with BwrapSandbox(repo, **LIMITS) as sb:
        res = await sb.exec(["python3", "-c", "while True: pass"], timeout=25)
        assert res.rc != 0  # SIGXCPU / SIGKILL from RLIMIT_CPU, well before the wall timeout


async def test_memory_limit(repo: Path) -> None:
    async with BwrapSandbox(repo, **LIMITS) as sb:
        res = await sb.exec(["python3", "-c", "b = bytearray(2 << 30)"])
        assert res.rc != 0 and "MemoryError" in res.stderr


async def test_wall_timeout_kills_the_tree(repo: Path) -> None:
    marker = f"vime-marker-{uuid.uuid4().hex}"
    async with BwrapSandbox(repo, **LIMITS) as sb:
        root = sb.root
        with pytest.raises(CommandTimeout, match="timed out after 0.5 s") as info:
            await sb.exec(f"echo started; sleep 300 & python3 -c 'import time; time.sleep(300)' {marker}", timeout=0.5)
        assert info.value.stdout == "started\n"
        assert _processes_mentioning(marker) == []
        assert (await sb.exec("echo still usable")).rc == 0
    await _assert_gone(root, marker)


async def test_nothing_left_after_normal_exit(repo: Path) -> None:
    marker = f"vime-marker-{uuid.uuid4().hex}"
    async with BwrapSandbox(repo, **LIMITS) as sb:
        root = sb.root
        # a daemonized grandchild that outlives its command: must still die with the sandbox
        await sb.exec(f"setsid python3 -c 'import time; time.sleep(300)' {marker} >/dev/null 2>&1 &")
        assert root.exists()
    await _assert_gone(root, marker)


async def test_nothing_left_after_exception(repo: Path) -> None:
    marker = f"vime-marker-{uuid.uuid4().hex}"
    sb = BwrapSandbox(repo, **LIMITS)
    with pytest.raises(RuntimeError, match="boom"):
        async with sb:
            root = sb.root
            task = asyncio.create_task(sb.exec(f"python3 -c 'import time; time.sleep(300)' {marker}"))
            await _wait_for_process(marker)
            raise RuntimeError("boom")
    await _assert_gone(root, marker)
    with pytest.raises(SandboxError):  # its sandbox was torn down under it: infra
        await task


def _sleep_in_a_sandbox(repo: Path) -> tuple[asyncio.Task, str, list[Path]]:
    """A rollout whose sandbox runs a 300 s command tagged with a marker: (task, marker, [root])."""
    marker = f"vime-marker-{uuid.uuid4().hex}"
    roots: list[Path] = []

    async def rollout() -> None:
        async with BwrapSandbox(repo, **LIMITS) as sb:
            roots.append(sb.root)
            await sb.exec(f"python3 -c 'import time; time.sleep(300)' {marker}")

    return asyncio.create_task(rollout()), marker, roots


async def test_nothing_left_after_cancel(repo: Path) -> None:
    task, marker, roots = _sleep_in_a_sandbox(repo)
    await _wait_for_process(marker)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await _assert_gone(roots[0], marker)


async def test_a_cancel_the_instant_bwrap_starts_returns_at_once_and_leaves_nothing(repo: Path) -> None:
    """Cancelled while bwrap was still being spawned, asyncio killed bwrap alone and then waited
    for its pipes, held by the sandboxed command: the cancel took as long as the command (300 s
    in a CI run). Every instant of the start-up is hit: right at the spawn and a little later."""
    for delay in (0, 0, 0, 0.001, 0.003, 0.01):
        task, marker, roots = _sleep_in_a_sandbox(repo)
        while not _processes_mentioning(marker):  # bwrap's own argv holds the marker
            await asyncio.sleep(0.0005)
        await asyncio.sleep(delay)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(task), 10)
        await _assert_gone(roots[0], marker)


async def _wait_for_process(marker: str) -> None:
    for _ in range(200):
        if _processes_mentioning(marker):
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"command with {marker} never started")


async def test_start_failures_are_infra_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        async with BwrapSandbox(tmp_path / "missing"):
            pass
    async with BwrapSandbox(None, **LIMITS) as sb:
        root = sb.root
        assert (await sb.exec("ls -A")).stdout == ""
        unmount(sb.workdir)  # the sandbox's disk vanished under it
        shutil.rmtree(sb.workdir)
        with pytest.raises(SandboxError, match="failed to start"):
            await sb.exec("true")
    assert not root.exists()
