"""How the suite spreads over two pytest-xdist workers (`.ci/run`: `-n 2 --dist loadgroup`).

Three rules keep a 2-core run short:

- **One group per shared server.** The tests on a shared vLLM server form one xdist group, so
  that server starts once in the whole run, on the worker that runs the group. The training
  server's tests and the sampling servers' tests are separate groups, so the two workers each hold
  a share of them instead of one worker running them all in a row. A module with a
  module-scoped fixture (its own server, a model it builds) is one group too. Groups that some
  test needs together are merged.
- **Longest first.** Work units (a group, or a lone test) are handed out in descending order of
  their measured cost (`tests/durations.json`, seconds per test from a `.ci/run`), so the long
  units start early and the short ones fill the tail. A test missing from the file counts as
  `UNKNOWN_COST`.
- **A server stops with its group.** `remaining_users` counts the tests of each group still to
  run here; the session fixture stops its server after the last one, so its memory and idle
  threads do not burden the tests that come after.

`python -m tests.scheduling JUNIT_XML` rewrites `tests/durations.json` from a run's JUnit report
(`.ci/run` keeps one in a temporary file and prints its summary).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")
UNKNOWN_COST = 5.0
"""Seconds assumed for a test the durations file does not know: a unit test, most likely."""

SPLIT_GROUPS = {"training-server": 2}
"""Groups too long for one worker, cut into this many parts by test file (longest first onto the
lightest part): each part is its own unit, and each worker that runs one starts its own server
(at most one per worker: the fixture is session-scoped). The parts' servers stay up to the end."""

SERVER_GROUPS = {
    "training_server": "training-server",
    "vllm_server": "sampling-servers",
    "long_context_server": "sampling-servers",
    "lora_server": "lora-server",
}
"""Session-scoped server fixture -> the xdist group of the tests that use it."""


def base_id(nodeid: str) -> str:
    """A node id without xdist's `@group` suffix: the key in the durations file."""
    at, bracket = nodeid.rfind("@"), nodeid.rfind("]")
    return nodeid[:at] if at > bracket else nodeid


def group_keys(fixture_scopes: dict[str, str], module: str) -> set[str]:
    """What ties a test to others, given the scope of each fixture it uses: the session servers
    it shares, and its module when it uses a module-scoped fixture (a server or a model built
    once per module: its tests run where it was built, or it is built on both workers)."""
    keys = {SERVER_GROUPS[name] for name in fixture_scopes if name in SERVER_GROUPS}
    if "module" in fixture_scopes.values():
        keys.add(module)
    return keys


def merge_groups(keys: list[set[str]]) -> tuple[list[str | None], dict[str, str]]:
    """One xdist group per test (None: a unit of its own): tests that share any key share a
    group, transitively (union-find), so nothing shared is set up on two workers. Also returns
    the group each key ended up in."""
    parent: dict[str, str] = {}

    def find(g: str) -> str:
        while parent.setdefault(g, g) != g:
            g = parent[g]
        return g

    servers = set(SERVER_GROUPS.values())
    for ks in keys:  # a server's group keeps the server's name (SPLIT_GROUPS goes by it)
        first, *rest = sorted(ks, key=lambda k: (k not in servers, k)) or [None]
        for other in rest:
            if find(other) != find(first):
                parent[find(other)] = find(first)
    return [find(min(ks)) if ks else None for ks in keys], {k: find(k) for k in parent}


def split_groups(nodeids: list[str], groups: list[str | None], durations: dict[str, float]) -> list[str | None]:
    """`groups` with each group of `SPLIT_GROUPS` cut into parts of about equal cost; the tests of
    one file stay in one part (its module-scoped fixtures are set up once)."""
    out = list(groups)
    for group, parts in SPLIT_GROUPS.items():
        files: Counter[str] = Counter()
        for nodeid, g in zip(nodeids, groups):
            if g == group:
                files[nodeid.split("::")[0]] += durations.get(base_id(nodeid), UNKNOWN_COST)
        load = [0.0] * parts
        part_of = {}
        for file, cost in sorted(files.items(), key=lambda fc: (-fc[1], fc[0])):
            k = load.index(min(load))
            part_of[file], load[k] = k, load[k] + cost
        for i, (nodeid, g) in enumerate(zip(nodeids, groups)):
            if g == group:
                out[i] = f"{group}-{part_of[nodeid.split('::')[0]] + 1}"
    return out


def load_durations(path: Path = DURATIONS) -> dict[str, float]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def cost_order(nodeids: list[str], groups: list[str | None], durations: dict[str, float]) -> list[int]:
    """Indices of the tests in the order to collect them: units by descending total cost, the
    tests of a unit together and in their own order."""
    unit_of = [g if g is not None else nodeid for nodeid, g in zip(nodeids, groups)]
    cost: Counter[str] = Counter()
    first: dict[str, int] = {}
    for i, (nodeid, unit) in enumerate(zip(nodeids, unit_of)):
        cost[unit] += durations.get(base_id(nodeid), UNKNOWN_COST)
        first.setdefault(unit, i)
    return sorted(range(len(nodeids)), key=lambda i: (-cost[unit_of[i]], first[unit_of[i]], i))


def durations_from_junit(xml_path: Path) -> dict[str, float]:
    """Seconds per test (setup, call and teardown: a session server's start counts to the test
    that started it) from a JUnit report, keyed by node id."""
    import xml.etree.ElementTree as ET

    seconds: dict[str, float] = {}
    for case in ET.parse(xml_path).iter("testcase"):
        module = case.get("classname", "").replace(".", "/")
        parts = module.split("/")
        # classname is "tests.test_x" or "tests.test_x.TestClass"
        path = "/".join(parts[:2]) + ".py"
        cls = "::".join(parts[2:])
        nodeid = "::".join(p for p in (path, cls, case.get("name", "")) if p)
        seconds[base_id(nodeid)] = round(seconds.get(base_id(nodeid), 0.0) + float(case.get("time", 0) or 0), 1)
    return seconds


def summary(seconds: dict[str, float]) -> str:
    """One line on a run's test time: the total, and the share the costliest files took."""
    by_file: Counter[str] = Counter()
    for nodeid, t in seconds.items():
        by_file[nodeid.split("::")[0]] += t
    top = ", ".join(f"{Path(f).stem} {t / 60:.1f}" for f, t in by_file.most_common(5))
    return f"test time {sum(seconds.values()) / 60:.1f} min over both workers (most, in min: {top})"


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--summary":
        print(summary(durations_from_junit(Path(argv[1]))))
        return 0
    if len(argv) != 1:
        print("usage: python -m tests.scheduling [--summary] JUNIT_XML\n"
              "  rewrites tests/durations.json from a run's JUnit report (--summary: prints one line)",
              file=sys.stderr)
        return 2
    found = durations_from_junit(Path(argv[0]))
    DURATIONS.write_text(json.dumps(dict(sorted(found.items())), indent=0) + "\n")
    print(f"{len(found)} tests -> {DURATIONS}; {summary(found)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
