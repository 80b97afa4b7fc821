"""Test-graded reward for a coding session's diff, computed in a sandbox of any backend.

Reward is 1.0 iff the diff is non-empty, applies to the clean task repository, and the task's
test command then exits 0 within its timeout; anything else is 0.0 with a one-line `reason`
and an `outcome`. Grading runs in its own fresh sandbox, never the agent's: the agent's
sandbox may hold anything (background processes, edited caches, a rewritten `.git`), while
`base + diff` is exactly what the session produced. The task's own test files are written
back after the diff, so editing the tests cannot earn reward.

Only a broken sandbox raises (`SandboxError`: infra); every outcome of the diff is a result.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vime.sandbox.base import CommandTimeout, Sandbox
from vime.sandbox.git import PatchDoesNotApply, init_base, restore_diff
from vime.errors import ConfigError

TEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
"""Tests run without writing caches and with a fixed hash seed, so a rerun sees the same thing."""

OUTCOMES = ("passed", "empty_diff", "patch_failed", "tests_failed", "timeout")


@dataclass(frozen=True)
class GradeResult:
    """`reward` in {0.0, 1.0}; `reason` says why in one line; `output` is the tail of the last command.

    `outcome` is one of OUTCOMES, for callers that type their errors (a patch that does not apply
    is a task failure, not an infra failure, and retrying it cannot help).
    """

    reward: float
    reason: str
    output: str = ""
    outcome: str = "tests_failed"


def task_test_files(repo_dir: str | Path) -> dict[str, bytes]:
    """The task's own tests (`test*.py` anywhere in `repo_dir`): path relative to it -> bytes."""
    root = Path(repo_dir)
    if not root.is_dir():
        raise FileNotFoundError(f"task repository {root} does not exist")
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("test*.py"))
        if p.is_file() and "__pycache__" not in p.parts
    }


def sandbox_command(test_command: str) -> str:
    """`test_command` as a sandbox runs it: a leading `python` becomes `python3`.

    Task files say `python -m ...`, but sandbox images (and hosts) often have only `python3`
    on PATH; in the bwrap sandbox the host's pyenv under /root is not even readable.
    """
    head, sep, rest = test_command.partition(" ")
    return f"python3{sep}{rest}" if head == "python" else test_command


async def grade_in_sandbox(
    make: Callable[[], Sandbox],
    diff: str,
    test_command: str,
    *,
    test_files: dict[str, bytes],
    timeout: float = 60.0,
) -> GradeResult:
    """Grade `diff` in `make()` (a fresh, not yet booted sandbox holding the clean task repo).

    `test_files` (see `task_test_files`) are written over whatever the diff did to them;
    `timeout` bounds the test command, whose whole process tree is killed past it.
    """
    if not diff.strip():
        return GradeResult(0.0, "empty diff", outcome="empty_diff")
    async with make() as sbx:
        await init_base(sbx)
        try:
            await restore_diff(sbx, diff)
        except PatchDoesNotApply as e:
            output = (e.result.stderr or e.result.stdout)[-4000:]
            return GradeResult(0.0, f"patch does not apply: {e.detail}", output, "patch_failed")
        for path, data in test_files.items():
            try:
                await sbx.write_file(path, data)
            except (OSError, ConfigError) as e:  # the diff made it a symlink or a directory
                return GradeResult(0.0, f"tests fail (the diff broke test file {path}: {e})")
        try:
            rc, out, err = await sbx.exec(sandbox_command(test_command), env=TEST_ENV, timeout=timeout)
        except CommandTimeout as e:
            output = (e.stdout + e.stderr)[-4000:]
            return GradeResult(0.0, f"tests fail (timed out after {timeout}s)", output, "timeout")
    output = (out + err)[-4000:]
    if rc == 0:
        return GradeResult(1.0, "tests pass", output, "passed")
    return GradeResult(0.0, f"tests fail (exit code {rc})", output, "tests_failed")
