"""The task table: each entry is a tiny repository with one realistic bug, its test, and the fix.

See `base.py` for the invariants every entry keeps."""

from __future__ import annotations

from .base import TaskDef
from .part1 import TASKS as _part1
from .part2 import TASKS as _part2
from .part3 import TASKS as _part3
from .part4 import TASKS as _part4

TASKS: list[TaskDef] = _part1 + _part2 + _part3 + _part4

__all__ = ["TASKS", "TaskDef"]
