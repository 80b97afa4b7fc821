"""The training workflow receives dataclasses from activities; Temporal decodes each by its type
hints, evaluated in the dataclass's module *as the workflow's sandbox sees it*. A module imported
only by the passed-through helpers (step_collection, trainer_session) is not in that sandbox, so a
hint naming another class there fails to decode at run time (a --rollout-function-path run hung
this way). Replay tests cannot see it when no recorded history has that activity."""

from __future__ import annotations

import ast
import dataclasses
import importlib
from pathlib import Path

import workflows.training

HELPERS = ["workflows/training.py", "workflows/step_collection.py", "workflows/trainer_session.py"]


def _result_types() -> set[type]:
    found = set()
    for path in HELPERS:
        module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
        for node in ast.walk(ast.parse(Path(module.__file__).read_text())):
            if isinstance(node, ast.keyword) and node.arg == "result_type":
                hint = eval(compile(ast.Expression(node.value), path, "eval"), vars(module))  # noqa: S307
                found |= {t for t in getattr(hint, "__args__", (hint,)) if dataclasses.is_dataclass(t)}
    return found


def _imported_by_training() -> set[str]:
    tree = ast.parse(Path(workflows.training.__file__).read_text())
    names = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    return names | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}


def test_every_module_whose_dataclasses_the_training_workflow_receives_is_imported_by_it():
    types = _result_types()
    assert types, "no result_type found: the test no longer reads the workflow's modules"
    missing = {t.__module__ for t in types} - _imported_by_training()
    assert not missing, f"workflows/training.py must import {sorted(missing)} (see the comment there)"
