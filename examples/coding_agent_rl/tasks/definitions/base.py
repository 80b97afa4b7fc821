"""What a task is: each entry of the table is a tiny repository with one realistic bug, its test, and the fix.

Invariants (checked by `make_tasks.py` and `prepare.py`): sources use only the standard
library; the tests run with `python -m unittest -q` from the repository root; every `fix`
`old` string occurs exactly once in its file; the unpatched tests fail and the fixed ones pass.
Prompts describe the symptom the way a user would file it, never the fix.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass, field


@dataclass(frozen=True)
class TaskDef:
    """One task: `files` holds the buggy repository (path -> text); `fixes` the gold edits."""

    task_id: str
    prompt: str
    files: dict[str, str]
    fixes: list[tuple[str, str, str]]  # (path, old, new), applied in order
    test_command: str = "python -m unittest -q"
    tags: list[str] = field(default_factory=list)


def _src(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")
