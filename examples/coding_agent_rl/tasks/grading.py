"""Test-graded reward for a coding task: apply a diff to a fresh copy of the repository, run its tests.

Reward is 1.0 iff the diff is non-empty, applies cleanly with `git apply`, and the task's test
command then exits 0; anything else is 0.0 with a `reason`. Every command goes through a `run`
callable (`Runner`), so a sandbox backend can replace `subprocess_runner` without touching the
grading logic; the repository copy and the patch file live in a temporary directory that is
always removed. The task's test files are restored after the diff is applied (`restore_tests`),
so only source changes can earn the reward.

This is the host-side grader (no sandbox); `vime.envs.coding_agent.grading.grade_in_sandbox` grades
the same way inside a sandbox, and owns `GradeResult`, `OUTCOMES` and `TEST_ENV`.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from vime.envs.coding_agent.grading import OUTCOMES, TEST_ENV, GradeResult, task_test_files
from vime.sandbox.git import GIT_ENV

__all__ = [  # GIT_ENV, OUTCOMES, TEST_ENV and GradeResult live in vime; re-exported here
    "GIT_ENV", "OUTCOMES", "TEST_ENV", "TIMEOUT_RC", "GradeResult", "Runner", "copy_repo", "grade",
    "grade_result", "init_git", "restore_test_files", "run_tests", "subprocess_runner",
]

TIMEOUT_RC = 124


class Runner(Protocol):
    """Runs one command in `cwd`; returns (returncode, stdout, stderr). Timeouts return rc 124."""

    def __call__(
        self, cmd: str | Sequence[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
    ) -> tuple[int, str, str]: ...


def subprocess_runner(
    cmd: str | Sequence[str], *, cwd: Path, timeout: float, env: dict[str, str] | None = None
) -> tuple[int, str, str]:
    """Local, unsandboxed runner. A leading `python` means this interpreter (hosts may lack `python`).

    The command runs in its own session; on timeout the whole process group is killed, so a test
    that forks or loops forever leaves nothing behind.
    """
    argv = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    if argv and argv[0] in ("python", "python3"):
        argv[0] = sys.executable
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env={**os.environ, **(env or {})},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        out, err = proc.communicate()
        return TIMEOUT_RC, out, err + f"\ntimed out after {timeout}s: {shlex.join(argv)}"


def copy_repo(repo_dir: Path, dest: Path) -> Path:
    """A clean copy of `repo_dir` at `dest` (no caches, no VCS metadata)."""
    shutil.copytree(repo_dir, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", ".git"))
    return dest


def init_git(repo: Path, *, run: Runner = subprocess_runner, timeout: float = 30.0) -> None:
    """Make `repo` a git repository with everything committed as `base`, so `git apply` has a base."""
    for cmd in (
        ["git", "-c", "init.defaultBranch=main", "init", "-q"],
        ["git", "add", "-A"],
        ["git", "commit", "-q", "--no-verify", "--no-gpg-sign", "-m", "base"],
    ):
        rc, out, err = run(cmd, cwd=repo, timeout=timeout, env=GIT_ENV)
        if rc != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed in {repo} (rc={rc}): {(err or out).strip()}")


def restore_test_files(original: Path, repo: Path) -> None:
    """Put the task's own `test*.py` files back, so a diff cannot pass by editing the tests."""
    for rel, data in task_test_files(original).items():
        dest = repo / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)


def run_tests(repo: Path, test_command: str, *, timeout: float, run: Runner = subprocess_runner) -> tuple[int, str]:
    """Run the task's tests; returns (returncode, combined output)."""
    rc, out, err = run(test_command, cwd=repo, timeout=timeout, env=TEST_ENV)
    return rc, out + err


def grade_result(
    repo_dir: str | Path,
    diff_text: str,
    test_command: str,
    timeout: float = 60.0,
    *,
    run: Runner = subprocess_runner,
    restore_tests: bool = True,
) -> GradeResult:
    """Apply `diff_text` to a fresh copy of `repo_dir` and run `test_command` there (see module doc)."""
    repo_dir = Path(repo_dir)
    if not repo_dir.is_dir():
        raise FileNotFoundError(f"task repository {repo_dir} does not exist; run make_tasks.py?")
    if not diff_text.strip():
        return GradeResult(0.0, "empty diff", outcome="empty_diff")
    with tempfile.TemporaryDirectory(prefix="vime-grade-") as tmp:
        repo = copy_repo(repo_dir, Path(tmp) / "repo")
        init_git(repo, run=run)
        patch = Path(tmp) / "patch.diff"
        patch.write_text(diff_text if diff_text.endswith("\n") else diff_text + "\n")
        rc, out, err = run(["git", "apply", "--whitespace=nowarn", str(patch)], cwd=repo, timeout=timeout, env=GIT_ENV)
        if rc != 0:
            detail = "; ".join(line.strip() for line in (err or out).splitlines() if line.strip())
            return GradeResult(0.0, f"patch does not apply: {detail}", (err or out)[-4000:], "patch_failed")
        if restore_tests:
            restore_test_files(repo_dir, repo)
        rc, output = run_tests(repo, test_command, timeout=timeout, run=run)
        if rc == 0:
            return GradeResult(1.0, "tests pass", output[-4000:], "passed")
        if rc == TIMEOUT_RC:
            return GradeResult(0.0, f"tests fail (timed out after {timeout}s)", output[-4000:], "timeout")
        return GradeResult(0.0, f"tests fail (exit code {rc})", output[-4000:], "tests_failed")


def grade(
    repo_dir: str | Path,
    diff_text: str,
    test_command: str,
    timeout: float = 60.0,
    *,
    run: Runner = subprocess_runner,
) -> float:
    """1.0 iff `diff_text` applies cleanly to a fresh copy of `repo_dir` and `test_command` passes there."""
    return grade_result(repo_dir, diff_text, test_command, timeout, run=run).reward
