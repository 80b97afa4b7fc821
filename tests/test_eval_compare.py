"""`vime eval --compare RUN_A RUN_B`: two runs' recorded eval rounds side by side, read from two
stores written by the store API (no service started), and a bad argument in one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_cli import REPO, one_error_line
from vime.errors import ConfigError
from vime.ops.eval_compare import compare, diff_text, parse_compare, read_rounds, render
from vime.store import SampleStore


def figures(name: str, reward: float, samples: int = 32, ks: tuple[int, ...] = (1, 2, 4), failed: int = 0) -> dict:
    return {f"eval/{name}/reward_mean": reward, f"eval/{name}/samples": samples, f"eval/{name}/failed": failed,
            **{f"eval/{name}/pass@{k}": min(1.0, reward * k) for k in ks}}


def write_run(run_dir: Path, run_id: str, rounds: dict[int, dict], summary: str = "summary.json") -> Path:
    with SampleStore.open(run_dir) as store:
        store.ensure_run(run_id)
        for step, metrics in rounds.items():
            store.write_eval_round(run_id, step, step, {**metrics, "eval_seconds": 1.0})
    (run_dir / summary).write_text(json.dumps({"run_id": run_id}))
    return run_dir


def vime(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "vime.cli", "eval", *argv], capture_output=True, text=True,
                          cwd=REPO, timeout=120)


def test_two_runs_rounds_are_compared_per_set_and_step_with_b_minus_a(tmp_path):
    a = write_run(tmp_path / "a", "base", {0: figures("heldout", 0.25), 4: figures("heldout", 0.5)})
    b = write_run(tmp_path / "b", "base-eval-1234", {0: figures("heldout", 0.25), 4: figures("heldout", 0.75)},
                  summary="eval.json")  # a vime eval run names itself in eval.json
    cmp = compare(read_rounds(str(a)), read_rounds(str(b)))
    assert (cmp.a.run_id, cmp.b.run_id, cmp.ks, cmp.notes) == ("base", "base-eval-1234", {"heldout": 4}, [])
    assert [(r["set"], r["step"]) for r in cmp.rows] == [("heldout", 0), ("heldout", 4)]
    assert cmp.rows[1]["reward_mean"] == {"a": 0.5, "b": 0.75, "diff": 0.25}
    assert cmp.rows[1]["pass@4"] == {"a": 1.0, "b": 1.0, "diff": 0.0}

    done = vime("--compare", str(a), str(b))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == f"A: base ({a}), 2 round(s)" and lines[1].startswith("B: base-eval-1234")
    assert lines[2].split() == ["set", "step", "reward", "A", "reward", "B", "diff", "pass@1", "A", "pass@1", "B",
                                "diff", "pass@4", "A", "pass@4", "B", "diff"]
    assert lines[4].split()[:5] == ["heldout", "4", "0.500", "0.750", "+0.250"]
    assert len(lines) == 5, "no note: the same sets, steps and sample counts"
    assert diff_text(0.2 - 0.2000001) == "+0.000" and diff_text(None) == "-", "never -0.000"
    as_json = json.loads(vime("--compare", str(a), str(b), "--json").stdout)
    assert as_json["rows"] == json.loads(json.dumps(cmp.rows)) and as_json["notes"] == []


def test_other_sets_steps_and_sample_counts_are_said_plainly(tmp_path):
    a = write_run(tmp_path / "a", "a", {0: {**figures("heldout", 0.2), **figures("math", 0.1)},
                                        4: figures("heldout", 0.4)})
    b = write_run(tmp_path / "b", "b", {0: {**figures("heldout", 0.3, samples=12, ks=(1, 2)), **figures("code", 0.5)},
                                        8: figures("heldout", 0.6, samples=12, ks=(1, 2))})
    cmp = compare(read_rounds(str(a)), read_rounds(str(b)))
    assert cmp.ks == {"heldout": 2}, "pass@k at the largest k both runs report"
    assert cmp.notes == [
        "sets only in A (a): math; not compared",
        "sets only in B (b): code; not compared",
        "heldout: 32 samples per round in A, 12 in B: the figures are not like for like (another set file, or "
        "other --n-samples-per-eval-prompt)",
        "heldout: no round of A at step 8",
        "heldout: no round of B at step 4"]
    assert [(r["step"], r["reward_mean"]["diff"]) for r in cmp.rows] == [(0, pytest.approx(0.1)), (4, None), (8, None)]
    text = render(cmp)
    assert "heldout  4     0.400     -         -" in text and text.endswith("no round of B at step 4")

    c = write_run(tmp_path / "c", "c", {0: figures("other", 0.5)})
    assert compare(read_rounds(str(a)), read_rounds(str(c))).notes[-1] == \
        "the two runs evaluated no set in common: nothing to compare"


def test_a_bad_argument_or_a_run_without_rounds_is_one_line(tmp_path):
    a = write_run(tmp_path / "a", "a", {0: figures("heldout", 0.2)})
    with SampleStore.open(tmp_path / "none") as store:
        store.ensure_run("none")
    line = one_error_line(vime("--compare", str(a)))
    assert "vime eval --compare takes two run directories" in line
    assert "recorded no eval round" in one_error_line(vime("--compare", str(a), str(tmp_path / "none")))
    assert "no vime store in" in one_error_line(vime("--compare", str(a), str(tmp_path)))
    assert "no such directory" in one_error_line(vime("--compare", str(a), str(tmp_path / "missing")))
    with pytest.raises(ConfigError, match="takes two run directories"):
        parse_compare(["--compare", str(a), str(a), "--checkpoints", "all"])
    assert parse_compare([f"--compare={a}", str(tmp_path), "--json"]) == (str(a), str(tmp_path), True)
    assert not (tmp_path / "missing").exists(), "comparing creates nothing"
