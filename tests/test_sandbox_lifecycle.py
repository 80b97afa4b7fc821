"""Sandboxes that outlive one activity, and an agent session's work as a diff, for real.

A Temporal workflow boots a sandbox in one activity, uses it from others (maybe in other worker
processes), captures its diff, grades the diff in a fresh sandbox and destroys the first one.
Each test does those steps with real bubblewrap sandboxes, from separate objects and separate
Python processes; afterwards no workdir and no bwrap process may be left (the `base` fixture).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from vime.config.args import VimeArgs
from vime.envs.coding_agent.sandbox_activities import SandboxActivities
from examples.coding_agent_rl.tasks.prepare import load_tasks
from tests.test_coding_tasks import edit_diff
from tests.test_sandbox import LIMITS, _processes_mentioning, _wait_for_process
from vime.envs.coding_agent.grading import GradeResult, grade_in_sandbox, task_test_files
from vime.sandbox import (
    BwrapSandbox,
    CommandError,
    SandboxError,
    SandboxGone,
    attach_sandbox,
)
from vime.sandbox.bwrap import reap_stale_workdirs
from vime.sandbox.git import PatchDoesNotApply, capture_diff, init_base, restore_diff
from vime.errors import ConfigError
from vime.store import SampleStore
from vime.envs.coding_agent.workflow import AgentTask, BootInput, SandboxRef

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")

TASKS = {t.task_id: t for t in load_tasks()}

ATTACH_AND_RUN = """
import asyncio, sys
from vime.sandbox import attach_sandbox

async def main(sandbox_id, base):
    sbx = await attach_sandbox("bwrap", sandbox_id, base_dir=base)
    await sbx.exec("echo worker > from_worker.txt", check=True)
    print((await sbx.exec("cat state.txt")).stdout, end="")

asyncio.run(main(*sys.argv[1:]))
"""

BOOT_AND_EXIT = """
import asyncio, sys
from vime.sandbox import BwrapSandbox

async def main(repo, base, boot_key=None):
    print((await BwrapSandbox(repo, base_dir=base, boot_key=boot_key).boot()).sandbox_id)

asyncio.run(main(*sys.argv[1:]))
"""

BOOT_AND_RUN_LONG = """
import asyncio, os, sys
from vime.sandbox import BwrapSandbox, SandboxGone

async def main(base, marker=os.environ["MARKER"]):
    sbx = await BwrapSandbox(None, base_dir=base).boot()
    print(sbx.sandbox_id, flush=True)
    try:
        await sbx.exec(f"python3 -c 'import time; time.sleep(300)' {marker}")
    except SandboxGone as e:
        print(type(e).__name__)

asyncio.run(main(*sys.argv[1:]))
"""


@pytest.fixture
def base() -> Iterator[Path]:
    """Where a test's sandboxes live; afterwards nothing may be left there or running over it.

    Not under pytest's tmp_path: bwrap runs as uid 65534, which cannot enter root's 0700 dirs.
    """
    path = Path(tempfile.mkdtemp(prefix="vime-lifecycle-"))
    path.chmod(0o755)
    try:
        yield path
        assert sorted(p.name for p in path.iterdir()) == [], "workdirs left behind"
        deadline = time.monotonic() + 5
        while (left := _processes_mentioning(str(path))) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left == [], f"processes left behind: {left}"
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "mod.py").write_text("X = 1\n")
    (root / "README").write_text("hello\n")
    (root / "run.sh").write_text("echo run\n")
    (root / "logo.bin").write_bytes(bytes(range(256)))
    return root


async def _python(script: str, *args: str) -> str:
    """Run `script` in a separate Python process (another worker on this host); its stdout."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    return out.decode()


async def _tree(sbx: BwrapSandbox, dest: Path) -> dict[str, tuple[bytes, bool]]:
    """The workspace as {path: (content, executable)}, without `.git` and caches."""
    await sbx.copy_out("/workspace", dest)
    return _tree_of(dest)


def _tree_of(root: Path) -> dict[str, tuple[bytes, bool]]:
    return {
        p.relative_to(root).as_posix(): (p.read_bytes(), os.access(p, os.X_OK))
        for p in sorted(root.rglob("*"))
        if p.is_file() and not {".git", "__pycache__"} & set(p.relative_to(root).parts)
    }


# -- lifecycle ---------------------------------------------------------------------------------


async def test_boot_attach_and_destroy_across_handles_and_processes(repo: Path, base: Path) -> None:
    sbx = await BwrapSandbox(repo, base_dir=base, **LIMITS).boot()
    assert sbx.root == base / f"vime-sbx-{os.getpid()}-{sbx.sandbox_id.removeprefix('bwrap-')}"
    await sbx.exec("echo booted > state.txt", check=True)

    handle = await attach_sandbox("bwrap", sbx.sandbox_id, base_dir=base, **LIMITS)
    assert isinstance(handle, BwrapSandbox) and handle is not sbx
    assert (handle.sandbox_id, handle.root) == (sbx.sandbox_id, sbx.root)
    assert await handle.read_file("state.txt") == b"booted\n"
    await handle.write_file("pkg/new.py", "Y = 2\n")
    assert (await sbx.exec("cat pkg/new.py")).stdout == "Y = 2\n"

    assert await _python(ATTACH_AND_RUN, sbx.sandbox_id, str(base)) == "booted\n"
    assert await sbx.read_file("from_worker.txt") == b"worker\n"

    mode = base.stat().st_mode
    await handle.destroy()
    assert not sbx.root.exists()
    with pytest.raises(SandboxGone, match=f"sandbox {sbx.sandbox_id} is gone"):
        await sbx.exec("true")  # the original learns on its next call, whatever the call
    with pytest.raises(SandboxGone):
        await sbx.read_file("state.txt")
    with pytest.raises(SandboxGone):
        await sbx.write_file("state.txt", "resurrected?")
    with pytest.raises(SandboxGone, match=sbx.sandbox_id):
        await BwrapSandbox.attach(sbx.sandbox_id, base_dir=base)
    await handle.destroy()
    await sbx.destroy()  # idempotent from every handle
    assert base.stat().st_mode == mode  # and it never touches the directory the sandboxes live in
    assert issubclass(SandboxGone, SandboxError)


async def test_async_with_is_boot_plus_destroy(repo: Path, base: Path) -> None:
    async with BwrapSandbox(repo, base_dir=base, **LIMITS) as sbx:
        root = sbx.root
        handle = await BwrapSandbox.attach(sbx.sandbox_id, base_dir=base, **LIMITS)
        assert (await handle.exec("cat README")).stdout == "hello\n"
        with pytest.raises(ConfigError, match="already running"):
            await sbx.boot()
    assert not root.exists()
    with pytest.raises(SandboxGone):
        await handle.exec("true")


async def test_destroy_kills_the_commands_another_process_runs(base: Path) -> None:
    marker = f"vime-marker-{uuid.uuid4().hex}"
    owner = await asyncio.create_subprocess_exec(  # the marker only in its sandboxed command's argv
        sys.executable, "-c", BOOT_AND_RUN_LONG, str(base), stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "MARKER": marker},
    )
    sandbox_id = (await asyncio.wait_for(owner.stdout.readline(), 60)).decode().strip()
    await _wait_for_process(marker)
    handle = await attach_sandbox("bwrap", sandbox_id, base_dir=base)
    await handle.destroy()
    assert _processes_mentioning(marker) == []
    out, _ = await asyncio.wait_for(owner.communicate(), 30)
    assert (owner.returncode, out.decode()) == (0, "SandboxGone\n")  # its command saw why


async def test_a_dead_owners_sandbox_lives_until_reaped(repo: Path, base: Path) -> None:
    sandbox_id = (await _python(BOOT_AND_EXIT, str(repo), str(base))).strip()
    orphan = await BwrapSandbox.attach(sandbox_id, base_dir=base, **LIMITS)
    assert (await orphan.exec("cat pkg/mod.py")).stdout == "X = 1\n"  # not reaped yet: usable

    async with BwrapSandbox(repo, base_dir=base, **LIMITS) as alive:
        assert reap_stale_workdirs(base) == [orphan.root]
        assert alive.root.exists()  # its owner (this process) lives
    with pytest.raises(SandboxGone, match=f"{sandbox_id} is gone"):
        await attach_sandbox("bwrap", sandbox_id, base_dir=base)
    with pytest.raises(SandboxGone):
        await orphan.exec("true")
    await orphan.destroy()


async def test_a_keyed_boot_destroys_what_an_earlier_attempt_of_the_same_boot_left_on_the_host(
        repo: Path, base: Path) -> None:
    """The first attempt booted in another process (a worker that died before reporting the
    boot); the retry, keyed the same, destroys that sandbox and boots its own. Other keys and
    unkeyed sandboxes are not touched."""
    first = (await _python(BOOT_AND_EXIT, str(repo), str(base), "wf-1/boot-0")).strip()
    other = await BwrapSandbox(repo, base_dir=base, boot_key="wf-1/boot-1", **LIMITS).boot()
    plain = await BwrapSandbox(repo, base_dir=base, **LIMITS).boot()
    assert len(list(base.iterdir())) == 3

    retry = await BwrapSandbox(repo, base_dir=base, boot_key="wf-1/boot-0", **LIMITS).boot()
    assert retry.replaced == [first] and retry.sandbox_id != first
    assert sorted(p.name for p in base.iterdir()) == sorted(s.root.name for s in (retry, other, plain))
    with pytest.raises(SandboxGone, match=first):
        await attach_sandbox("bwrap", first, base_dir=base)
    assert (await retry.exec("cat pkg/mod.py")).stdout == "X = 1\n"
    assert other.replaced == plain.replaced == []
    for sbx in (retry, other, plain):
        await sbx.destroy()


async def test_boot_sandbox_run_twice_with_one_key_leaves_one_workdir_and_no_bwrap_of_the_first(
        repo: Path, base: Path, tmp_path: Path, monkeypatch) -> None:
    """The `boot_sandbox` activity retried after a boot whose completion was lost, while a
    command still runs in the first sandbox: the retry kills it and removes its workdir."""
    from temporalio.testing import ActivityEnvironment

    monkeypatch.setattr(tempfile, "tempdir", str(base))  # where the activity's sandboxes live
    args = VimeArgs(sandbox_backend="bwrap", sandbox_task_queue="sbx")
    task = AgentTask("0", 0, 0, "fix it", str(repo), "true")
    marker = f"vime-marker-{uuid.uuid4().hex}"
    with SampleStore.open(tmp_path / "run") as store:
        acts = SandboxActivities(args, store, host_queue="sbx-host-1")
        env = ActivityEnvironment()
        first = await env.run(acts.boot_sandbox, BootInput(task, "wf-7/boot-0"))
        handle = await attach_sandbox("bwrap", first.sandbox_id)
        running = asyncio.create_task(handle.exec(f"python3 -c 'import time; time.sleep(300)' {marker}"))
        await _wait_for_process(marker)

        retry = await env.run(acts.boot_sandbox, BootInput(task, "wf-7/boot-0"))
        assert first.task_queue == retry.task_queue == "sbx-host-1" and retry.sandbox_id != first.sandbox_id
        assert [p.name for p in base.iterdir()] == [f"vime-sbx-{os.getpid()}-{retry.sandbox_id.removeprefix('bwrap-')}"]
        assert _processes_mentioning(marker) == []
        with pytest.raises(SandboxGone):
            await running
        assert set(acts.booted) == {retry.sandbox_id}
        sbx = await attach_sandbox("bwrap", retry.sandbox_id)
        assert (await sbx.exec("git tag")).stdout == "vime-base\n"  # booted all the way: base committed
        assert await env.run(acts.teardown_sandbox, SandboxRef(retry.sandbox_id, retry.task_queue))


async def test_attaching_to_ids_that_never_existed(base: Path) -> None:
    with pytest.raises(SandboxGone, match="bwrap-0123456789ab is gone"):
        await attach_sandbox("bwrap", "bwrap-0123456789ab", base_dir=base)
    with pytest.raises(ConfigError, match="not a bwrap sandbox id"):
        await BwrapSandbox.attach("e2b-i0fs8qu1", base_dir=base)
    with pytest.raises(ConfigError, match="unknown backend"):
        await attach_sandbox("nope", "bwrap-0123456789ab")


# -- diffs -------------------------------------------------------------------------------------


async def test_diff_round_trip_into_a_fresh_sandbox(repo: Path, base: Path, tmp_path: Path) -> None:
    async with BwrapSandbox(repo, base_dir=base, **LIMITS) as sbx:
        await init_base(sbx)
        assert await capture_diff(sbx) == ""
        await sbx.exec("python3 -c 'import pkg.mod'", check=True)  # writes pkg/__pycache__
        assert await capture_diff(sbx) == ""  # caches are never changes
        await sbx.exec(
            "echo 'X = 2' > pkg/mod.py && rm README && chmod +x run.sh && mkdir -p new/deep && "
            "echo hi > new/deep/file.txt && touch new/empty && printf '\\000\\001\\377' > new/blob.bin "
            "&& printf 'caf\\351\\n' > latin1.txt && printf '\\377' >> logo.bin",
            check=True,
        )
        diff = await capture_diff(sbx)
        changed = await _tree(sbx, tmp_path / "changed")
        assert (await sbx.exec("ls pkg/__pycache__")).ok
    for part in ("+X = 2", "deleted file mode", "old mode 100644\nnew mode 100755",
                 "new/deep/file.txt", "new/empty", "GIT binary patch", "latin1.txt"):
        assert part in diff, part
    assert "__pycache__" not in diff

    async with BwrapSandbox(repo, base_dir=base, **LIMITS) as fresh:
        await init_base(fresh)
        await restore_diff(fresh, diff)
        assert await _tree(fresh, tmp_path / "restored") == changed
        assert await capture_diff(fresh) == diff
        await fresh.exec("echo junk > junk.txt && echo 'X = 3' > pkg/mod.py", check=True)
        await restore_diff(fresh, diff)  # whatever was there is discarded first
        assert await _tree(fresh, tmp_path / "again") == changed
        await restore_diff(fresh, "")
        assert await _tree(fresh, tmp_path / "base") == _tree_of(repo)


async def test_a_diff_that_does_not_apply_names_where(repo: Path, base: Path, tmp_path: Path) -> None:
    stale = "--- a/pkg/mod.py\n+++ b/pkg/mod.py\n@@ -1 +1 @@\n-X = 100\n+X = 2\n"
    async with BwrapSandbox(repo, base_dir=base, **LIMITS) as sbx:
        await init_base(sbx)
        for diff, where in ((stale, "pkg/mod.py:1"), (stale.replace("pkg/mod.py", "gone.py"), "gone.py"),
                            ("not a diff at all\n", None)):
            with pytest.raises(PatchDoesNotApply) as info:
                await restore_diff(sbx, diff)
            assert info.value.where == where and isinstance(info.value, CommandError)
            assert str(info.value).startswith("diff does not apply to vime-base")
            assert await _tree(sbx, tmp_path / str(uuid.uuid4())) == _tree_of(repo)  # all or nothing


# -- grading -----------------------------------------------------------------------------------


async def _grade(task_id: str, diff: str, base: Path, timeout: float = 30.0) -> GradeResult:
    task = TASKS[task_id]
    return await grade_in_sandbox(
        lambda: BwrapSandbox(task.repo, base_dir=base, **LIMITS),
        diff,
        task.test_command,
        test_files=task_test_files(task.repo),
        timeout=timeout,
    )


async def test_gold_patch_gets_reward_one_on_every_task(base: Path) -> None:
    ids = sorted(TASKS)
    results: dict[str, GradeResult] = {}
    for start in range(0, len(ids), 4):
        batch = ids[start : start + 4]
        graded = await asyncio.gather(*(_grade(i, TASKS[i].gold_diff, base) for i in batch))
        results.update(zip(batch, graded, strict=True))
    assert len(results) >= 30
    assert {i: (r.reward, r.outcome) for i, r in results.items()} == {i: (1.0, "passed") for i in ids}, [
        (i, r.reason, r.output) for i, r in results.items() if r.reward != 1.0
    ]


async def test_diffs_that_earn_nothing(base: Path) -> None:
    empty = await _grade("pagination_page_count", "", base)
    assert empty == GradeResult(0.0, "empty diff", outcome="empty_diff")

    repo = TASKS["pagination_page_count"].repo
    broken = edit_diff(repo, "pagination.py", "return total // per_page", "return (total + per_page - 1) //")
    result = await _grade("pagination_page_count", broken, base)
    assert (result.reward, result.outcome) == (0.0, "tests_failed") and "SyntaxError" in result.output

    result = await _grade("pagination_page_count", TASKS["stack_peek_top"].gold_diff, base)
    assert (result.reward, result.outcome) == (0.0, "patch_failed")
    assert result.reason.startswith("patch does not apply: error: ") and "\n" not in result.reason

    stack = TASKS["stack_peek_top"].repo
    cheat = edit_diff(stack, "test_stack.py", "assertEqual(stack.peek(), 2)", "assertEqual(stack.peek(), 1)")
    result = await _grade("stack_peek_top", cheat, base)
    assert (result.reward, result.outcome) == (0.0, "tests_failed")  # the task's tests were put back

    digits = TASKS["digit_sum_negative"].repo
    loop = edit_diff(digits, "digits.py", "    return sum(", "    while True:\n        pass\n    return sum(")
    result = await _grade("digit_sum_negative", loop, base, timeout=1.0)
    assert (result.reward, result.outcome) == (0.0, "timeout") and "timed out" in result.reason
