"""How a stored sample is summarized for people: its failure class, its policy versions, a
one-line preview of a text. Shared by the rollout workflow's Web UI memo (activities/rollout.py)
and the `vime samples/show/report` commands (vime.ops), so both say the same thing."""

from __future__ import annotations

from typing import Any


def failure_of(status: str, metadata: dict) -> tuple[str, str]:
    """The kind of failure and its cause: infrastructure (vLLM, sandbox, timeouts: the rollout
    is retried or weighted out), an error of the model's output or the user's hooks, or an
    aborted/truncated generation."""
    if metadata.get("infra_failure"):
        return "infra", str(metadata["infra_failure"])
    if metadata.get("error"):
        source = metadata.get("error_source")
        return (f"error ({source})" if source else "error"), str(metadata["error"])
    grade = metadata.get("grade")
    if isinstance(grade, dict) and grade.get("outcome") and grade["outcome"] != "passed":
        return f"grade: {grade.get('outcome')}", str(grade.get("reason") or "")
    if status in ("failed", "aborted", "truncated"):
        return status, ""
    return "", ""


FAILURE_CLASSES = ("infra", "timeout", "reward_error", "generate_error", "aborted", "error")
"""The classes of a sample with no reward (failed or aborted: what `vime samples --failed` lists),
as metric names: `eval/<set>/failed/<class>`."""


def failure_class(status: str, metadata: dict) -> str:
    """The class of a sample that has no reward, one of `FAILURE_CLASSES`: infrastructure (vLLM,
    a sandbox, a reward service: retried or weighted out), a hook that ran past its time limit, a
    reward or a generate hook that raised, an aborted generation; `error` for anything else.
    `failure_of` says the same in words (with the hook's name), for people; this is its key."""
    if metadata.get("infra_failure"):
        return "infra"
    if status == "aborted":
        return "aborted"
    error, source = str(metadata.get("error") or ""), str(metadata.get("error_source") or "")
    if error.startswith("HookTimeout") or " timed out after " in error:
        return "timeout"
    if source.startswith(("--custom-rm-path", "environment reward")):
        return "reward_error"
    return "generate_error" if error else "error"


def versions_text(weight_versions: list) -> str:
    """`3`, or `3-4` when the response spans a weight update (an agent session)."""
    found = []
    for entry in weight_versions or []:
        version = entry.get("version") if isinstance(entry, dict) else entry
        if version is not None and str(version) not in found:
            found.append(str(version))
    return "-".join(found) if found else "?"


def preview(text: Any, width: int = 60) -> str:
    """`text` on one line, cut to `width` characters; chat messages: the last one's content."""
    if isinstance(text, list):
        text = text[-1].get("content", "") if text and isinstance(text[-1], dict) else " ".join(map(str, text))
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"
