"""`vime eval --compare RUN_A RUN_B`: two runs' recorded eval rounds side by side, from their
stores alone (nothing is started, nothing sampled).

A run is a directory with a store: a training run that evaluated (`--eval-interval`) or an eval
run of `vime eval` (`RUN/evals/<id>`). Rounds are matched by step (a training run's round after
k steps, `vime eval`'s round of the checkpoint at step k), so a run can be compared with another
run, or with `vime eval` of its own checkpoints. Per set and step: mean reward, pass@1 and the
largest pass@k both runs report, each with B - A. What makes two figures not like for like is
said in plain lines under the table: a set or a step only one run has, other sample counts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import distinct, select

from vime.errors import ConfigError
from vime.ops.commands import table
from vime.ops.locate import open_existing
from vime.rollout.eval_metrics import round_sets
from vime.store.database import DB_FILENAME
from vime.store.models import EvalRoundRow

USAGE = "usage: vime eval --compare RUN_A RUN_B [--json]  (two run directories with recorded eval rounds)"


@dataclass
class RunRounds:
    """One run's recorded eval rounds: figures by step."""

    run_id: str
    path: str
    rounds: dict[int, dict[str, Any]]

    def sets(self) -> list[str]:
        return sorted({name for figures in self.rounds.values() for name in round_sets(figures)})


@dataclass
class Comparison:
    a: RunRounds
    b: RunRounds
    ks: dict[str, int]  # per set, the k of the pass@k compared: the largest both runs report
    rows: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_id_of(run_dir: Path) -> str:
    """The run id a directory holds: its `summary.json` (`vime train`) or `eval.json` (`vime
    eval`) names it, else the directory's name (both commands' default)."""
    for name in ("summary.json", "eval.json"):
        path = run_dir / name
        if path.is_file():
            try:
                found = json.loads(path.read_text()).get("run_id")
            except (json.JSONDecodeError, AttributeError):
                continue
            if found:
                return str(found)
    return run_dir.name


def read_rounds(location: str) -> RunRounds:
    """The recorded eval rounds of the run in directory `location`; one line when it has none."""
    run_dir = Path(location)
    if not run_dir.is_dir():
        raise ConfigError(f"vime eval --compare {location}: no such directory; give two run directories\n{USAGE}")
    if not (run_dir / DB_FILENAME).is_file():
        raise ConfigError(f"vime eval --compare {location}: no vime store in it (no {DB_FILENAME}); give the "
                          "directory of a training run or of a vime eval run")
    run_id = run_id_of(run_dir)
    with open_existing(run_dir) as store:
        rounds = {r.step: r.metrics for r in store.eval_rounds(run_id)}
        if not rounds:
            with store.engine.connect() as conn:
                others = sorted(conn.execute(select(distinct(EvalRoundRow.run_id))).scalars())
            if len(others) == 1:  # a directory renamed, or a --run-id of its own: the one run that evaluated
                run_id = others[0]
                rounds = {r.step: r.metrics for r in store.eval_rounds(run_id)}
    if not rounds:
        raise ConfigError(f"vime eval --compare {location}: run {run_id!r} recorded no eval round; train with "
                          "--eval-interval N --eval-prompt-data NAME FILE, or run `vime eval` on its checkpoints")
    return RunRounds(run_id, str(run_dir), dict(sorted(rounds.items())))


def _ks(figures: dict[str, Any], name: str) -> set[int]:
    return {int(k.rsplit("@", 1)[1]) for k in figures if k.startswith(f"eval/{name}/pass@")}


def _samples(run: RunRounds, name: str) -> set[int]:
    return {int(f[f"eval/{name}/samples"]) for f in run.rounds.values() if f.get(f"eval/{name}/samples") is not None}


def compare(a: RunRounds, b: RunRounds) -> Comparison:
    """The rows set x step (steps either run evaluated the set at) and the notes."""
    common = [name for name in a.sets() if name in b.sets()]
    ks = {}
    for name in common:
        both = set.intersection(*(_ks(f, name) for run in (a, b) for f in run.rounds.values() if name in round_sets(f)))
        ks[name] = max(both) if both else 1
    cmp = Comparison(a, b, ks)
    for label, run, other in (("A", a, b), ("B", b, a)):
        if only := [name for name in run.sets() if name not in other.sets()]:
            cmp.notes.append(f"sets only in {label} ({run.run_id}): {', '.join(only)}; not compared")
    if not common:
        cmp.notes.append("the two runs evaluated no set in common: nothing to compare")
    for name in common:
        sa, sb = _samples(a, name), _samples(b, name)
        if sa != sb:
            cmp.notes.append(f"{name}: {_counts(sa)} samples per round in A, {_counts(sb)} in B: the figures are "
                             "not like for like (another set file, or other --n-samples-per-eval-prompt)")
        steps = sorted({s for run in (a, b) for s, f in run.rounds.items() if name in round_sets(f)})
        for label, run in (("A", a), ("B", b)):
            if missing := [s for s in steps if name not in round_sets(run.rounds.get(s, {}))]:
                cmp.notes.append(f"{name}: no round of {label} at step {', '.join(map(str, missing))}")
        for step in steps:
            fa, fb = a.rounds.get(step, {}), b.rounds.get(step, {})
            row: dict[str, Any] = {"set": name, "step": step}
            for figure in ("reward_mean", "pass@1", f"pass@{ks[name]}"):
                va, vb = fa.get(f"eval/{name}/{figure}"), fb.get(f"eval/{name}/{figure}")
                row[figure] = {"a": va, "b": vb, "diff": None if va is None or vb is None else vb - va}
            cmp.rows.append(row)
    return cmp


def _counts(values: set[int]) -> str:
    return "/".join(map(str, sorted(values))) or "no"


def diff_text(value: float | None) -> str:
    return "-" if value is None else f"{round(value, 3) or 0.0:+.3f}"  # no -0.000


def render(cmp: Comparison) -> str:
    """The table (A, B and B - A per figure) with a line per run above and the notes below."""
    header = ["set", "step"]
    figures = sorted({f for row in cmp.rows for f in row if f not in ("set", "step")},
                     key=lambda f: (f != "reward_mean", int(f.split("@")[1]) if "@" in f else 0))
    names = {"reward_mean": "reward"}
    for f in figures:
        short = names.get(f, f)
        header += [f"{short} A", f"{short} B", "diff"]
    rows = [[r["set"], r["step"], *[v for f in figures for v in
                                    (r.get(f, {}).get("a"), r.get(f, {}).get("b"), diff_text(r.get(f, {}).get("diff")))]]
            for r in cmp.rows]
    lines = [f"A: {cmp.a.run_id} ({cmp.a.path}), {len(cmp.a.rounds)} round(s)",
             f"B: {cmp.b.run_id} ({cmp.b.path}), {len(cmp.b.rounds)} round(s)"]
    if rows:
        lines.append(table(rows, header))
    return "\n".join([*lines, *cmp.notes])


def parse_compare(argv: list[str]) -> tuple[str, str, bool]:
    """`(RUN_A, RUN_B, --json)` from `--compare RUN_A RUN_B [--json]`; anything else is one line."""
    rest = [a for a in argv if a != "--json"]
    if len(rest) == 2 and rest[0].startswith("--compare="):
        rest = ["--compare", rest[0].split("=", 1)[1], rest[1]]
    if len(rest) != 3 or rest[0] != "--compare" or any(a.startswith("-") for a in rest[1:]):
        raise ConfigError(f"vime eval --compare takes two run directories (and --json), got {' '.join(argv)!r}; "
                          f"{USAGE.removeprefix('usage: ')}")
    return rest[1], rest[2], "--json" in argv


def compare_main(argv: list[str]) -> int:
    """`vime eval --compare RUN_A RUN_B [--json]`."""
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + (__doc__ or ""))
        return 0
    path_a, path_b, as_json = parse_compare(argv)
    cmp = compare(read_rounds(path_a), read_rounds(path_b))
    if as_json:
        print(json.dumps({"a": {"run_id": cmp.a.run_id, "path": cmp.a.path}, "b": {"run_id": cmp.b.run_id,
                          "path": cmp.b.path}, "ks": cmp.ks, "rows": cmp.rows, "notes": cmp.notes}, indent=1))
    else:
        print(render(cmp))
    return 0
