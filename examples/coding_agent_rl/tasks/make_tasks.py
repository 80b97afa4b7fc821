"""Write the task set from `definitions.TASKS`: `repos/<id>/`, `patches/<id>.diff`, `tasks.jsonl`.

    python -m examples.coding_agent_rl.tasks.make_tasks [--out DIR]

The output is committed; rerun this after editing the table, then `prepare` to check it. Gold
patches are real `git diff` output (fixed identity and config, see `grading.GIT_ENV`), so they
apply with `git apply` exactly as an agent's captured diff would. Writing is deterministic:
the same table gives byte-identical files.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from .definitions import TASKS, TaskDef
from .grading import GIT_ENV, init_git, subprocess_runner

TASKS_DIR = Path(__file__).resolve().parent


def write_files(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def fixed_files(task: TaskDef) -> dict[str, str]:
    """The repository after the gold fix; each `old` must occur exactly once in its file."""
    files = dict(task.files)
    for rel, old, new in task.fixes:
        count = files[rel].count(old)
        if count != 1:
            raise ValueError(f"task {task.task_id!r}: fix text {old!r} occurs {count} times in {rel}, expected 1")
        files[rel] = files[rel].replace(old, new)
    return files


def gold_diff(task: TaskDef) -> str:
    """`git diff` from the buggy repository to the fixed one."""
    with tempfile.TemporaryDirectory(prefix="vime-make-task-") as tmp:
        repo = Path(tmp)
        write_files(repo, task.files)
        init_git(repo)
        write_files(repo, fixed_files(task))
        rc, out, err = subprocess_runner(
            ["git", "diff", "--no-color", "--no-ext-diff", "--src-prefix=a/", "--dst-prefix=b/"],
            cwd=repo,
            timeout=30,
            env=GIT_ENV,
        )
        if rc != 0 or not out:
            raise RuntimeError(f"task {task.task_id!r}: git diff failed (rc={rc}): {err.strip()}")
        return out


def task_record(task: TaskDef) -> dict:
    return {
        "task_id": task.task_id,
        "repo": f"repos/{task.task_id}",
        "prompt": task.prompt,
        "test_command": task.test_command,
        "gold_patch": f"patches/{task.task_id}.diff",
        "tags": task.tags,
    }


def make_tasks(out: Path = TASKS_DIR, tasks: list[TaskDef] = TASKS) -> Path:
    """Replace `out/repos`, `out/patches` and `out/tasks.jsonl` with the table's tasks; returns the JSONL path."""
    ids = [t.task_id for t in tasks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"duplicate task ids: {dupes}")
    for sub in ("repos", "patches"):
        shutil.rmtree(out / sub, ignore_errors=True)
        (out / sub).mkdir(parents=True)
    for task in tasks:
        write_files(out / "repos" / task.task_id, task.files)
        (out / "patches" / f"{task.task_id}.diff").write_text(gold_diff(task))
    jsonl = out / "tasks.jsonl"
    jsonl.write_text("".join(json.dumps(task_record(t)) + "\n" for t in tasks))
    return jsonl


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=TASKS_DIR, help="directory to write (default: next to this file)")
    args = parser.parse_args(argv)
    jsonl = make_tasks(args.out)
    print(f"wrote {len(TASKS)} tasks to {jsonl}")


if __name__ == "__main__":
    main()
