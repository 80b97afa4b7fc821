"""The shipped coding task set and its grader (examples/coding_agent_rl/tasks).

Real git and real test runs on temporary copies; tasks run in a thread pool so the file stays
within a few seconds.
"""

from __future__ import annotations

import difflib
import filecmp
import json
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from examples.coding_agent_rl.tasks import make_tasks, prepare
from examples.coding_agent_rl.tasks.definitions import TASKS
from examples.coding_agent_rl.tasks.grading import grade, grade_result, subprocess_runner

TASKS_DIR = Path(make_tasks.__file__).parent
ALL = prepare.load_tasks()
BY_ID = {t.task_id: t for t in ALL}


def edit_diff(repo: Path, rel: str, old: str, new: str) -> str:
    """A unified diff (a/ b/ paths) replacing `old` by `new` in `repo/rel`."""
    before = (repo / rel).read_text()
    assert before.count(old) == 1, f"{old!r} not unique in {rel}"
    after = before.replace(old, new)
    return "".join(
        difflib.unified_diff(
            before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{rel}", f"b/{rel}"
        )
    )


def test_task_set_shape():
    assert len(ALL) >= 30
    assert len(BY_ID) == len(ALL), "duplicate task ids"
    for task in ALL:
        files = sorted(p.name for p in task.repo.iterdir())
        tests = [f for f in files if f.startswith("test")]
        sources = [f for f in files if f.endswith(".py") and f not in tests]
        assert len(tests) == 1 and 1 <= len(sources) <= 2, (task.task_id, files)
        assert task.gold_patch.read_text().startswith("diff --git a/"), task.task_id
        assert task.prompt and task.test_command


def test_committed_output_matches_table(tmp_path):
    """The committed repos/patches/tasks.jsonl are exactly what make_tasks writes from the table."""
    make_tasks.make_tasks(tmp_path)
    assert (tmp_path / "tasks.jsonl").read_text() == (TASKS_DIR / "tasks.jsonl").read_text()
    for sub in ("repos", "patches"):
        generated = sorted(p.relative_to(tmp_path / sub) for p in (tmp_path / sub).rglob("*") if p.is_file())
        committed = sorted(
            p.relative_to(TASKS_DIR / sub)
            for p in (TASKS_DIR / sub).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts
        )
        assert generated == committed
        _, mismatch, errors = filecmp.cmpfiles(tmp_path / sub, TASKS_DIR / sub, generated, shallow=False)
        assert not mismatch and not errors, (mismatch, errors)
    assert len(TASKS) == len(ALL)


def test_prepare_passes_on_every_task():
    checks = prepare.prepare(ALL, timeout=60)
    broken = [(c.task_id, c.reason) for c in checks if not c.ok]
    assert not broken
    assert len(checks) >= 30


def test_gold_patch_gets_reward_one_on_every_task():
    with ThreadPoolExecutor(8) as pool:
        rewards = dict(
            zip(BY_ID, pool.map(lambda t: grade(t.repo, t.gold_diff, t.test_command, 60), ALL), strict=True)
        )
    assert rewards == {task_id: 1.0 for task_id in BY_ID}


def test_empty_diff_gets_zero_and_leaves_no_temp_dirs(tmp_path, monkeypatch):
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    task = ALL[0]
    for diff in ("", "  \n"):
        result = grade_result(task.repo, diff, task.test_command, 30)
        assert (result.reward, result.reason, result.outcome) == (0.0, "empty diff", "empty_diff")
    task = BY_ID["pagination_page_count"]
    assert grade(task.repo, task.gold_diff, task.test_command, 30) == 1.0
    assert list(scratch.iterdir()) == []


def test_diff_that_breaks_the_repo_gets_zero():
    task = BY_ID["pagination_page_count"]
    diff = edit_diff(task.repo, "pagination.py", "return total // per_page", "return (total + per_page - 1) //")
    result = grade_result(task.repo, diff, task.test_command, 30)
    assert result.reward == 0.0
    assert result.reason.startswith("tests fail"), result.reason
    assert result.outcome == "tests_failed"
    assert "SyntaxError" in result.output


def test_diff_that_does_not_apply_gets_zero_with_reason():
    task = BY_ID["pagination_page_count"]
    stale = edit_diff(task.repo, "pagination.py", "return total // per_page", "return -1").replace(
        "return total // per_page", "return total // size"
    )
    for diff in (stale, BY_ID["stack_peek_top"].gold_diff, "not a diff at all\n"):
        result = grade_result(task.repo, diff, task.test_command, 30)
        assert result.reward == 0.0
        assert result.outcome == "patch_failed"
        assert result.reason.startswith("patch does not apply: error: "), result.reason
        assert "\n" not in result.reason


def test_editing_the_tests_earns_nothing():
    task = BY_ID["stack_peek_top"]
    diff = edit_diff(task.repo, "test_stack.py", "assertEqual(stack.peek(), 2)", "assertEqual(stack.peek(), 1)")
    assert grade(task.repo, diff, task.test_command, 30) == 0.0


def test_endless_loop_is_stopped_by_the_timeout():
    task = BY_ID["digit_sum_negative"]
    diff = edit_diff(task.repo, "digits.py", "    return sum(", "    while True:\n        pass\n    return sum(")
    result = grade_result(task.repo, diff, task.test_command, timeout=1.0)
    assert result.reward == 0.0
    assert "timed out" in result.reason and result.outcome == "timeout"


def test_runner_is_injectable():
    """Every command goes through `run`, the seam a sandbox backend plugs into."""
    seen = []

    def recording_runner(cmd, *, cwd, timeout, env=None):
        seen.append(cmd if isinstance(cmd, str) else " ".join(cmd))
        return subprocess_runner(cmd, cwd=cwd, timeout=timeout, env=env)

    task = BY_ID["clamp_swapped_bounds"]
    assert grade(task.repo, task.gold_diff, task.test_command, 30, run=recording_runner) == 1.0
    assert any(c.startswith("git apply") for c in seen)
    assert seen[-1] == task.test_command


def test_prepare_cli_names_broken_tasks(tmp_path, capsys):
    good = BY_ID["url_join_slashes"]
    fixed_repo = tmp_path / "repos" / "already_fixed"
    fixed_repo.mkdir(parents=True)
    (fixed_repo / "ok.py").write_text("X = 1\n")
    (fixed_repo / "test_ok.py").write_text(
        "import unittest\n\n\nclass T(unittest.TestCase):\n    def test(self):\n        pass\n"
    )
    lines = [
        f'{{"task_id": "good", "repo": "{good.repo}", "prompt": "p", "test_command": "{good.test_command}", '
        f'"gold_patch": "{good.gold_patch}"}}',
        '{"task_id": "already_fixed", "repo": "repos/already_fixed", "prompt": "p", '
        f'"test_command": "python -m unittest -q", "gold_patch": "{good.gold_patch}"}}',
        '{"task_id": "no_patch", "repo": "repos/already_fixed", "prompt": "p", '
        '"test_command": "python -m unittest -q", "gold_patch": "patches/missing.diff"}',
    ]
    tasks_file = tmp_path / "tasks.jsonl"
    tasks_file.write_text("\n".join(lines) + "\n")
    assert prepare.main(["--tasks", str(tasks_file)]) == 1
    out, err = capsys.readouterr()
    assert "1/3 tasks ok" in out
    assert "unpatched tests pass" in out and "gold patch" in out
    assert err.strip() == "broken tasks: already_fixed, no_patch"


@pytest.mark.parametrize("field", ["task_id", "gold_patch"])
def test_load_tasks_names_missing_fields(tmp_path, field):
    record = {"task_id": "t", "repo": "r", "prompt": "p", "test_command": "c", "gold_patch": "g"}
    del record[field]
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=field):
        prepare.load_tasks(path)
