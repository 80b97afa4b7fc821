"""A coding task as a prompt record describes it: the words, the repository, the tests.

A record of `--prompt-data` is a coding task when its `metadata` names the repository
(`repo`: a directory, absolute or relative to the prompt file) and the `test_command` that
grades a diff; `task_id` (or the record's label) names it. The workflow activities and the
`generate` hook both read tasks through `coding_task`, so both accept the same data.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.types import Sample


@dataclass(frozen=True)
class CodingTask:
    prompt: str
    repo_dir: str
    test_command: str
    task_id: str = ""


def prompt_text(prompt: Any) -> str:
    """The task's words: the prompt itself, or the user turns of a chat-messages prompt."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        return "\n\n".join(str(m.get("content", "")) for m in prompt if isinstance(m, dict) and m.get("role") == "user")
    raise ConfigError(f"coding task prompt must be text or chat messages, got {type(prompt).__name__}")


def coding_task(sample: Sample, data_dir: str | Path) -> CodingTask:
    """The coding task of `sample` (see the module doc); a clear error when it is not one."""
    meta = sample.metadata or {}
    where = f"prompt {sample.group_index} of --prompt-data"
    missing = [k for k in ("repo", "test_command") if not meta.get(k)]
    if missing:
        raise ConfigError(f"{where}: metadata lacks {missing}; a coding task needs metadata.repo (the task "
                          "repository) and metadata.test_command (what grades the diff)")
    repo = Path(meta["repo"])
    repo = repo if repo.is_absolute() else Path(data_dir) / repo
    if not repo.is_dir():
        raise ConfigError(f"{where}: task repository {str(repo)!r} does not exist")
    return CodingTask(prompt_text(sample.prompt), str(repo), meta["test_command"],
                      str(meta.get("task_id") or sample.label or ""))
