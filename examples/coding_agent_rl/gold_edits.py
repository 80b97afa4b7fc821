"""From a task's gold patch to the `edit_file` calls that make the same change, and the prompt
file a training run reads.

The synthetic SFT traces (`examples/coding_agent_rl/sft_traces.py`) show the model one way to
solve each task with the agent's own tools: one `edit_file(path, old, new)` per hunk, then
`finish`. `old` is the smallest run of the hunk's original lines that contains every removed
line and occurs exactly once in the file, so the call is short and unambiguous.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from examples.coding_agent_rl.tasks.prepare import CodingTask

_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


@dataclass(frozen=True)
class Edit:
    path: str
    old: str
    new: str

    def arguments(self) -> dict:
        return {"path": self.path, "old": self.old, "new": self.new}


def _hunks(diff: str) -> list[tuple[str, list[str]]]:
    """(path, hunk lines with their ' '/'-'/'+' prefix) for every hunk of a unified diff."""
    out: list[tuple[str, list[str]]] = []
    path = None
    for line in diff.splitlines():
        if line.startswith("+++ "):
            path = line[4:].removeprefix("b/")
        elif _HUNK.match(line):
            out.append((path, []))
        elif out and line[:1] in (" ", "-", "+") and not line.startswith(("--- ", "+++ ")):
            out[-1][1].append(line)
    return out


def _unique_window(lines: list[str], text: str) -> tuple[int, int]:
    """The smallest [lo, hi) around the changed lines whose original text is unique in `text`."""
    changed = [i for i, l in enumerate(lines) if l[:1] in "-+"]
    lo, hi = min(changed), max(changed) + 1
    while True:
        old = "".join(l[1:] + "\n" for l in lines[lo:hi] if l[:1] != "+")
        if old.strip() and text.count(old) == 1:
            return lo, hi
        if lo == 0 and hi == len(lines):
            raise ValueError("no unique context for the hunk")
        lo, hi = max(0, lo - 1), min(len(lines), hi + 1)


def gold_edits(task: CodingTask) -> list[Edit]:
    """The gold patch as `edit_file` calls, in order (each applies to the file as the previous
    ones left it)."""
    files: dict[str, str] = {}
    edits = []
    for path, lines in _hunks(task.gold_diff):
        text = files.setdefault(path, (task.repo / path).read_text())
        lo, hi = _unique_window(lines, text)
        window = lines[lo:hi]
        old = "".join(l[1:] + "\n" for l in window if l[:1] != "+")
        new = "".join(l[1:] + "\n" for l in window if l[:1] != "-")
        edits.append(Edit(path, old, new))
        files[path] = text.replace(old, new, 1)
    return edits


def write_prompts(tasks: list[CodingTask], path: Path, repeat: int = 1) -> Path:
    """The prompt file of a training run: one record per task (`repeat` times), the task
    repository and test command in `metadata` (what CodingAgentRolloutWorkflow needs)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for _ in range(repeat):
            for t in tasks:
                f.write(json.dumps({"prompt": t.prompt, "label": t.task_id,
                                    "metadata": {"task_id": t.task_id, "repo": str(t.repo.resolve()),
                                                 "test_command": t.test_command}}) + "\n")
    return path
