"""How a stored sample is summarized for people: its failure class, how it finished, its policy
versions, which activity attempt and worker sampled it, a one-line preview of a text. Shared by
the rollout workflows' Web UI memo (`vime.envs.contract`) and the `vime samples/show/report`
commands (vime.ops), so both say the same thing.

A sample that hit the length limit (status `truncated`) finished: its tokens are trained like any
other, so `truncated` is a finish reason (`finish_of`), never a failure (`failure_of`), and
`vime samples --failed` does not list it.

Standard library only: workflows import it, and `vime show`/`vime samples` must answer without
loading torch or vLLM."""

from __future__ import annotations

from typing import Any


def failure_of(status: str, metadata: dict) -> tuple[str, str]:
    """The kind of failure and its cause: infrastructure (vLLM, sandbox, timeouts: the rollout
    is retried or weighted out), an error of the model's output or the user's hooks, or an
    aborted generation. ("", "") for a sample that finished, truncated ones included."""
    if metadata.get("infra_failure"):
        return "infra", str(metadata["infra_failure"])
    if metadata.get("error"):
        source = metadata.get("error_source")
        return (f"error ({source})" if source else "error"), str(metadata["error"])
    grade = metadata.get("grade")
    if isinstance(grade, dict) and grade.get("outcome") and grade["outcome"] != "passed":
        return f"grade: {grade.get('outcome')}", str(grade.get("reason") or "")
    if status in ("failed", "aborted"):
        return status, ""
    return "", ""


FINISH_REASONS = {"completed": "stop", "truncated": "length"}
"""How a finished sample's generation ended, by its status: it stopped on its own (an end of
turn, a stop string) or hit the length limit (`--rollout-max-response-len`, the context)."""


def finish_of(status: str) -> str:
    """`stop`, `length` (truncated: hit the length limit) or "" (not finished: failed, aborted,
    pending), in vLLM's words for a request's finish reason."""
    return FINISH_REASONS.get(status, "")


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


SAMPLED_BY = "sampled_by"
"""The metadata key naming the activity attempt that sampled a turn: `"<activity id>#<attempt>"`,
e.g. `"2#2"`: the workflow's 2nd activity (its activity id, a counter per workflow run), on its
2nd attempt (1 is the first; more means it was retried: its worker died, its engine failed).
Several, comma-separated, when a sample's turns were sampled by several attempts (a resumed
session). `worker` beside it names the Temporal identity of the worker that ran that attempt."""


def sampled_by(activity_id: str, attempt: int) -> str:
    return f"{activity_id}#{attempt}"


def attempts_text(value: str | None, worker: str | None = None) -> str:
    """`sampled_by` as words: "activity 2, attempt 2 (a retry) on worker W"; "" when unknown."""
    parts = []
    for one in str(value or "").split(","):
        activity_id, _, attempt = one.strip().rpartition("#")
        if not attempt.isdigit():
            continue
        retry = " (a retry)" if int(attempt) > 1 else ""
        parts.append(f"activity {activity_id or '?'}, attempt {attempt}{retry}")
    if not parts:
        return ""
    return "; ".join(parts) + (f" on worker {worker}" if worker else "")


def sample_attempts(metadata: dict) -> tuple[str, str]:
    """(`sampled_by`, `worker`) of a sample: its own (a multi-agent role's turn, an agent
    session), else those of its turns (`metadata["turns"]`, a multi-turn rollout), each distinct
    value once, in order, comma-separated."""
    if metadata.get(SAMPLED_BY):
        return str(metadata[SAMPLED_BY]), str(metadata.get("worker") or "")
    turns = [t for t in metadata.get("turns") or [] if isinstance(t, dict)] if isinstance(
        metadata.get("turns"), list) else []
    return _distinct(t.get(SAMPLED_BY) for t in turns), _distinct(t.get("worker") for t in turns)


def _distinct(values) -> str:
    return ",".join(dict.fromkeys(str(v) for v in values if v))


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
