"""What a bubblewrap sandbox may take from its host, for real (issue #21, "Sandboxes that hold
the host"): a drill wrote 300 MiB into each of the sandbox's `/`, `/dev/shm` and `/workspace`
(host RAM and disk without bound), read a checkout's README from inside, and saw correct code
time out on a loaded host. Each test is one of those, with caps far below 300 MiB."""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from vime.config.args import VimeArgs, parse_args
from vime.envs.coding_agent.config import sandbox_options
from vime.errors import ConfigError
from vime.sandbox import BwrapSandbox, SandboxError
from vime.sandbox.bwrap_limits import SYSTEM_DIRS, flag_options

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

CHECKOUT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
CAPS = dict(workspace_bytes=16 * MiB, tmp_bytes=8 * MiB, shm_bytes=4 * MiB)
WRITE_300_MIB = "head -c {} /dev/zero > {}/big; echo rc=$?; stat -c %s {}/big 2>/dev/null || echo none"
LIMITS = dict(cpu_seconds=30, memory_bytes=1 << 30, max_processes=64, wall_timeout=60.0)


def _vime_mounts() -> list[str]:
    """Mounts of sandboxes this process booted (`vime-sbx-<pid>-...`): another test process
    (the other xdist worker) may have sandboxes of its own mounted at the same moment."""
    own = f"vime-sbx-{os.getpid()}-"
    return [line for line in Path("/proc/mounts").read_text().splitlines() if own in line]


@pytest.fixture
def hidden_file() -> Iterator[Path]:
    """A host file in this checkout (where the drill read a README), readable by anyone, so only
    the sandbox's bind list can hide it."""
    top = Path(tempfile.mkdtemp(prefix=".vime-hidden-", dir=CHECKOUT))
    top.chmod(0o755)
    secret = top / "README"
    secret.write_text("host secret\n")
    secret.chmod(0o644)
    try:
        yield secret
    finally:
        shutil.rmtree(top)


@pytest.mark.parametrize("mount, cap", [("/workspace", "workspace_bytes"), ("/tmp", "tmp_bytes"),
                                        ("/dev/shm", "shm_bytes")])
async def test_300_mib_written_to_a_writable_mount_stops_at_its_cap_and_nothing_stays_on_the_host(
        mount: str, cap: str) -> None:
    """What the host can lose is the mount's size: a filesystem of exactly the cap (RAM), seen
    from inside (`df`) and, for the workspace that outlives a command, from the host too."""
    async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
        root = sb.root
        res = await sb.exec(WRITE_300_MIB.format(300 * MiB, mount, mount) + f"; df -B1 --output=size {mount}")
        assert "No space left on device" in res.stderr and "rc=1" in res.stdout, res
        written, size = int(res.stdout.split()[-3]), int(res.stdout.split()[-1])
        assert CAPS[cap] - MiB <= written <= CAPS[cap] == size, f"{mount} took {written} of {size} bytes"
        if mount == "/workspace":
            assert shutil.disk_usage(sb.workdir).total == CAPS[cap]
            assert shutil.disk_usage(sb.workdir).used >= written  # it persists until destroy()
        assert (await sb.exec("echo still usable")).stdout == "still usable\n"
    assert not root.exists() and _vime_mounts() == [], "the workspace or its mount outlived destroy()"


@pytest.mark.parametrize("where", ["/", "/dev", "/etc", "/usr"])
async def test_the_rest_of_the_sandbox_is_read_only(where: str) -> None:
    async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
        res = await sb.exec(WRITE_300_MIB.format(300 * MiB, where.rstrip("/"), where.rstrip("/")))
        assert "Read-only file system" in res.stderr and res.stdout.endswith("none\n"), res


async def test_the_workspace_persists_across_commands_within_its_cap() -> None:
    async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
        await sb.exec(f"head -c {10 * MiB} /dev/zero > a", check=True)
        second = await sb.exec(f"head -c {10 * MiB} /dev/zero > b")  # 20 MiB in all: over 16
        assert second.rc != 0 and "No space left" in second.stderr
        await sb.exec("rm b", check=True)
        assert (await sb.exec("stat -c %s a")).stdout == f"{10 * MiB}\n"
        await sb.write_file("from_host.txt", "ok")  # the host side writes into the same tmpfs
        assert (await sb.exec("cat from_host.txt")).stdout == "ok"


async def test_a_repo_larger_than_the_workspace_cap_fails_to_boot_and_says_which_option(tmp_path: Path) -> None:
    repo = tmp_path / "big"
    repo.mkdir()
    (repo / "blob").write_bytes(b"\0" * (2 * MiB))
    with pytest.raises(SandboxError, match=r"does not fit in workspace_bytes=1048576; raise it"):
        await BwrapSandbox(repo, workspace_bytes=MiB).boot()
    assert _vime_mounts() == []


async def test_a_host_file_outside_the_bound_paths_cannot_be_read(hidden_file: Path) -> None:
    async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
        for path in (hidden_file, CHECKOUT / "README.md", Path.home() / ".bashrc"):
            res = await sb.exec(["cat", str(path)])
            assert res.rc != 0 and "No such file or directory" in res.stderr and res.stdout == "", path
        seen = (await sb.exec("ls -A /")).stdout.split()
        assert set(seen) <= {Path(d).name for d in SYSTEM_DIRS} | {"proc", "dev", "tmp", "workspace"}, seen
        for host_path in ("/root", "/home", "/work", "/opt", "/mnt", "/var", "/sys", "/run"):
            assert (await sb.exec(["test", "-e", host_path])).rc != 0, f"{host_path} is visible"
    async with BwrapSandbox(None, ro_binds=[hidden_file.parent], **CAPS, **LIMITS) as sb:
        assert (await sb.exec(["cat", str(hidden_file)])).stdout == "host secret\n"  # bound on purpose


@pytest.fixture
def checkout_under_tmp() -> Iterator[Path]:
    """A checkout where CI clones one (/tmp/ciN: directly under the host's /tmp, mode 0755),
    holding a tool in node_modules as Claude Code's is."""
    top = Path(tempfile.mkdtemp(prefix="vime-ci-", dir=tempfile.gettempdir()))
    top.chmod(0o755)
    tool = top / "node_modules" / ".bin"
    tool.mkdir(parents=True)
    (tool / "cli").write_text("#!/bin/sh\necho cli ran from $0\n")
    (tool / "cli").chmod(0o755)
    (top / "README.md").write_text("not bound\n")
    try:
        yield top
    finally:
        shutil.rmtree(top)


async def test_a_host_path_bound_from_under_tmp_stays_visible_over_the_private_tmp(
        checkout_under_tmp: Path) -> None:
    """bwrap mounts in argument order: the private /tmp once covered a bound path under /tmp, so
    Claude Code bound from a CI clone in /tmp/ciN was missing inside. The bound path is seen,
    read-only, and nothing else of the host's /tmp is; the private /tmp stays writable."""
    modules = checkout_under_tmp / "node_modules"
    async with BwrapSandbox(None, ro_binds=[modules], **CAPS, **LIMITS) as sb:
        res = await sb.exec([str(modules / ".bin" / "cli")])
        assert res.stdout == f"cli ran from {modules}/.bin/cli\n", res
        assert "Read-only file system" in (await sb.exec(f"touch {modules}/new")).stderr
        assert (await sb.exec(["ls", "-A", str(checkout_under_tmp)])).stdout == "node_modules\n"
        private = await sb.exec("echo ok > /tmp/scratch && cat /tmp/scratch && ls -A /tmp")
        assert private.stdout.split() == ["ok", *sorted([checkout_under_tmp.name, "scratch"])], private


@pytest.mark.parametrize("path", ["/", "/tmp", "/dev", "/dev/shm", "/proc", "/workspace"])
def test_a_bind_that_would_cover_a_private_mount_is_refused(path: str) -> None:
    """Binding the host's /tmp (or an ancestor) would show every other sandbox's workdir and
    replace the capped private /tmp."""
    with pytest.raises(ConfigError, match=f"ro_binds {path!r}: covers the sandbox's own"):
        BwrapSandbox(None, ro_binds=[path])


async def test_python_git_and_node_still_work_inside() -> None:
    async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
        assert (await sb.exec(["python3", "-c", "import json, ssl, sqlite3; print('py')"])).stdout == "py\n"
        git = await sb.exec("git init -q . && git -c user.name=a -c user.email=a@b commit -q --allow-empty -m x "
                            "&& git log --oneline | wc -l")
        assert git.stdout == "1\n", git
        if shutil.which("node"):
            assert (await sb.exec(["node", "-e", "console.log(6 * 7)"])).stdout == "42\n"


async def test_the_cpu_time_limit_stops_a_busy_loop_and_the_result_says_so() -> None:
    async with BwrapSandbox(None, **{**LIMITS, "cpu_seconds": 1}) as sb:
        t0 = time.monotonic()
        res = await sb.exec(["python3", "-c", "while True: pass"], timeout=30)
        assert res.rc != 0 and res.stopped_by == "cpu_seconds", res
        assert time.monotonic() - t0 < 20  # the CPU limit, not the 30 s wall clock
        assert (await sb.exec("sleep 2; echo slept")).stopped_by is None  # waiting costs no CPU time


async def test_at_most_max_concurrent_commands_run_at_once_and_the_wait_is_not_timed() -> None:
    cap = 2
    sandboxes = [BwrapSandbox(None, max_concurrent=cap, **CAPS, **LIMITS) for _ in range(2)]
    for sb in sandboxes:
        await sb.boot()
    try:
        # each command stamps its start and end (ns, the host's clock, which every sandbox shares)
        cmd = "date +%s%N; sleep 1.5; date +%s%N"
        runs = [sandboxes[i % 2].exec(cmd, timeout=2.5) for i in range(cap + 1)]
        results = await asyncio.gather(*runs)  # the 3rd waits 1.5 s for a slot: no CommandTimeout
        spans = [tuple(map(int, r.stdout.split())) for r in results]
        for start, _ in spans:
            running = sum(1 for s, e in spans if s <= start < e)
            assert running <= cap, f"{running} commands ran at once with max_concurrent={cap}: {spans}"
        assert max(s for s, _ in spans) >= min(e for _, e in spans)  # the last one did wait
    finally:
        for sb in sandboxes:
            await sb.destroy()


def test_bad_caps_name_the_option_and_what_to_do() -> None:
    for kwargs, needle in [(dict(tmp_bytes=None), "tmp_bytes=None"), (dict(shm_bytes=0), "shm_bytes=0"),
                           (dict(workspace_bytes=-1), "workspace_bytes=-1"), (dict(cpu_seconds=0), "cpu_seconds=0"),
                           (dict(max_concurrent=0), "max_concurrent=0")]:
        with pytest.raises(ConfigError, match=f"{needle}: must be a positive integer"):
            BwrapSandbox(None, **kwargs)


def test_the_sandbox_flags_reach_the_bwrap_constructor_with_their_defaults() -> None:
    defaults = sandbox_options(parse_args([]))
    assert defaults == dict(workspace_bytes=1024 * MiB, tmp_bytes=256 * MiB, shm_bytes=64 * MiB,
                            cpu_seconds=600, max_concurrent=None)
    assert BwrapSandbox(None).max_concurrent == max(8, 4 * len(os.sched_getaffinity(0)))
    args = parse_args(["--sandbox-workspace-mb", "0", "--sandbox-tmp-mb", "32", "--sandbox-shm-mb", "8",
                       "--sandbox-cpu-seconds", "60", "--sandbox-max-concurrent", "3"])
    assert sandbox_options(args, "/repo") == dict(workspace_bytes=None, tmp_bytes=32 * MiB, shm_bytes=8 * MiB,
                                                  cpu_seconds=60, max_concurrent=3, repo_dir="/repo")
    assert sandbox_options(VimeArgs(sandbox_backend="e2b")) == {}
    with pytest.raises(ConfigError, match="--sandbox-tmp-mb 0: must be at least 1"):
        flag_options(VimeArgs(sandbox_tmp_mb=0))


async def test_a_worker_that_may_not_mount_boots_an_uncapped_workspace_and_warns_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Not root (no CAP_SYS_ADMIN): the mount itself fails with EPERM; the sandbox keeps working
    over a plain host directory, as before the cap, and the process says so once."""
    import errno

    from vime.sandbox import bwrap_limits as bwrap

    def no_mount(path: Path, size: int, uid: int | None) -> None:
        raise OSError(errno.EPERM, "mount tmpfs: Operation not permitted", str(path))  # PermissionError

    monkeypatch.setattr(bwrap, "mount_tmpfs", no_mount)
    monkeypatch.setattr(bwrap, "_warned_no_mount", False)
    caplog.set_level("WARNING", logger=bwrap.__name__)
    for _ in range(2):
        async with BwrapSandbox(None, **CAPS, **LIMITS) as sb:
            assert not os.path.ismount(sb.workdir)
            await sb.write_file("a.txt", "ok")
            assert (await sb.exec("cat a.txt; echo more > b.txt")).stdout == "ok"
            assert (await sb.read_file("b.txt")) == b"more\n"
    warnings = [r.getMessage() for r in caplog.records if r.name == bwrap.__name__]
    assert len(warnings) == 1, warnings
    assert "workspace_bytes" in warnings[0] and "--sandbox-workspace-mb" in warnings[0], warnings
    assert "not root" in warnings[0] and "mount permission" in warnings[0], warnings
