"""The workflows every step runs, outside Temporal's sandbox, and the source checks that stand in
for it.

Temporal's Python sandbox re-imports a workflow's module for each run and restricts what its
code may import and call, so that a clock read, a random number or a file opened in workflow
code fails at run time (modules passed through, as vime's workflows import theirs, are not
checked by it). That guard costs CPU on every activation in the worker that hosts them: `TrainingWorkflow`
is activated several times a step, and a step's eight `RolloutWorkflow`s once each. On 2 cores
it was 0.07 s of the quickstart's 0.45 s rollout phase (`bench/rollout_overhead.py`, rollout
0.46-0.49 s sandboxed vs 0.39-0.41 s without, runs alternating). So those two run unsandboxed,
and what the sandbox enforced is checked here, in their source and in every module they import
from this repository (more than the sandbox saw):

- outside modules only from `DETERMINISTIC` (no `time`, `random`, `uuid`, `os`, threads,
  sockets or subprocesses), and no heavy ones (DESIGN.md principle 2);
- no clock but the workflow's (`workflow.now()`), no `open()`, no `global` (module state would
  outlive a run now that modules are not re-imported per run).

Environments' workflows, which users write, keep the sandbox.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from temporalio import workflow

from workflows.rollout import RolloutWorkflow
from workflows.training import TrainingWorkflow

REPO = Path(__file__).resolve().parent.parent
UNSANDBOXED = {"workflows.training": TrainingWorkflow, "workflows.rollout": RolloutWorkflow}
OWN = ("vime", "workflows")
DETERMINISTIC = {"__future__", "asyncio", "collections", "dataclasses", "datetime", "enum", "functools", "math",
                 "re", "temporalio", "typing"}
CLOCK_CALLS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def _path(module: str) -> Path | None:
    for candidate in (REPO / f"{module.replace('.', '/')}.py", REPO / module.replace(".", "/") / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(tree: ast.AST) -> list[str]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        elif isinstance(node, ast.Import):
            names += [a.name for a in node.names]
    return names


def reachable(roots) -> tuple[dict[str, ast.AST], set[str]]:
    """The repository modules `roots` import, transitively, as parsed trees; and the outside
    modules they import (top-level names). A package's `__init__` is not followed: it runs once
    when the worker imports it, never as workflow code."""
    own: dict[str, ast.AST] = {}
    outside: set[str] = set()
    todo = list(roots)
    while todo:
        module = todo.pop()
        if module in own or (path := _path(module)) is None:
            continue
        own[module] = tree = ast.parse(path.read_text(), str(path))
        for name in _imported(tree):
            (todo.append(name) if name.split(".")[0] in OWN else outside.add(name.split(".")[0]))
    return own, outside


def violations(module: str, tree: ast.AST) -> list[str]:
    """What the sandbox would have refused at run time, found in `tree`'s source."""
    found = []
    for node in ast.walk(tree):
        where = f"{module}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Global):
            found.append(f"{where}: `global {', '.join(node.names)}` (module state outlives a run)")
        elif isinstance(node, ast.Call):
            fn = node.func
            if isinstance(fn, ast.Name) and fn.id == "open":
                found.append(f"{where}: open() (files in workflow code)")
            elif (isinstance(fn, ast.Attribute) and fn.attr in CLOCK_CALLS
                  and not (isinstance(fn.value, ast.Name) and fn.value.id == "workflow")):
                found.append(f"{where}: .{fn.attr}() (a clock other than workflow.now())")
    return found


def test_the_step_loop_and_its_groups_run_outside_the_sandbox():
    for cls in UNSANDBOXED.values():
        assert workflow._Definition.must_from_class(cls).sandboxed is False, cls.__name__


def test_they_import_only_deterministic_outside_modules():
    _, outside = reachable(UNSANDBOXED)
    assert outside <= DETERMINISTIC, f"unsandboxed workflow code imports {sorted(outside - DETERMINISTIC)}"


def test_they_read_no_clock_but_the_workflows_open_no_file_and_keep_no_module_state():
    own, _ = reachable(UNSANDBOXED)
    assert "workflows.step_collection" in own and "vime.envs.group_workflow" in own  # the walk follows imports
    found = [v for module, tree in own.items() for v in violations(module, tree)]
    assert found == []


@pytest.mark.parametrize("source, what", [
    ("import time\nx = time.time()", ".time()"),
    ("from datetime import datetime\nnow = datetime.now()", ".now()"),
    ("def f():\n    return open('x').read()", "open()"),
    ("seen = []\ndef f():\n    global seen\n    seen = [1]", "global seen"),
])
def test_the_checks_catch_what_the_sandbox_caught(source, what):
    assert any(what in v for v in violations("example", ast.parse(source)))
    assert violations("example", ast.parse("from temporalio import workflow\nt = workflow.now()")) == []
