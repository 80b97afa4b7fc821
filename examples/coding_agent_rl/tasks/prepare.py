"""Check the task set: every unpatched repository fails its tests, every gold patch makes them pass.

    python -m examples.coding_agent_rl.tasks.prepare [--tasks PATH] [--timeout S] [--workers N]

Prints one line per task and a summary; exits 1 naming each broken task. Each check runs on a
fresh temporary copy, so the committed repositories are never touched.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from .grading import GradeResult, Runner, copy_repo, grade, grade_result, run_tests, subprocess_runner

__all__ = ["CodingTask", "TaskCheck", "check_task", "grade", "grade_result", "load_tasks", "prepare", "main"]

DEFAULT_TASKS = Path(__file__).resolve().parent / "tasks.jsonl"
REQUIRED_FIELDS = ("task_id", "repo", "prompt", "test_command", "gold_patch")


@dataclass(frozen=True)
class CodingTask:
    """One line of tasks.jsonl, with `repo` and `gold_patch` resolved against the file's directory."""

    task_id: str
    repo: Path
    prompt: str
    test_command: str
    gold_patch: Path

    @property
    def gold_diff(self) -> str:
        return self.gold_patch.read_text()


def load_tasks(path: str | Path = DEFAULT_TASKS) -> list[CodingTask]:
    path = Path(path)
    root = path.parent
    tasks = []
    for lineno, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        record = json.loads(line)
        missing = [f for f in REQUIRED_FIELDS if f not in record]
        if missing:
            raise ValueError(f"{path}:{lineno}: task {record.get('task_id', '?')!r} lacks fields {missing}")
        tasks.append(
            CodingTask(
                task_id=record["task_id"],
                repo=root / record["repo"],
                prompt=record["prompt"],
                test_command=record["test_command"],
                gold_patch=root / record["gold_patch"],
            )
        )
    return tasks


@dataclass(frozen=True)
class TaskCheck:
    task_id: str
    ok: bool
    reason: str
    seconds: float


def check_task(task: CodingTask, *, timeout: float = 60.0, run: Runner = subprocess_runner) -> TaskCheck:
    """(1) the unpatched tests fail, (2) the gold patch applies and the tests then pass."""
    start = time.monotonic()

    def done(ok: bool, reason: str) -> TaskCheck:
        return TaskCheck(task.task_id, ok, reason, time.monotonic() - start)

    if not task.repo.is_dir():
        return done(False, f"repository {task.repo} is missing")
    if not task.gold_patch.is_file():
        return done(False, f"gold patch {task.gold_patch} is missing")
    with tempfile.TemporaryDirectory(prefix="vime-prepare-") as tmp:
        rc, output = run_tests(copy_repo(task.repo, Path(tmp) / "repo"), task.test_command, timeout=timeout, run=run)
    if rc == 0:
        return done(False, "unpatched tests pass; the task has no bug to fix")
    result: GradeResult = grade_result(task.repo, task.gold_diff, task.test_command, timeout, run=run)
    if result.reward != 1.0:
        return done(False, f"gold patch: {result.reason}")
    return done(True, f"unpatched fail (rc={rc}), gold passes")


def prepare(
    tasks: list[CodingTask], *, timeout: float = 60.0, workers: int = 8, run: Runner = subprocess_runner
) -> list[TaskCheck]:
    """`check_task` for every task, `workers` at a time; results in task order."""
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        return list(pool.map(lambda t: check_task(t, timeout=timeout, run=run), tasks))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=Path, default=DEFAULT_TASKS, help="tasks.jsonl to check")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per test run")
    parser.add_argument("--workers", type=int, default=8, help="tasks checked in parallel")
    args = parser.parse_args(argv)
    tasks = load_tasks(args.tasks)
    ids = [t.task_id for t in tasks]
    if len(set(ids)) != len(ids):
        print(f"duplicate task ids in {args.tasks}", file=sys.stderr)
        return 1
    start = time.monotonic()
    checks = prepare(tasks, timeout=args.timeout, workers=args.workers)
    for c in checks:
        print(f"{'ok  ' if c.ok else 'FAIL'} {c.task_id:<32} {c.seconds:5.2f}s  {c.reason}")
    broken = [c.task_id for c in checks if not c.ok]
    print(f"{len(checks) - len(broken)}/{len(checks)} tasks ok in {time.monotonic() - start:.1f}s")
    if broken:
        print(f"broken tasks: {', '.join(broken)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
