"""The group contract as an environment sees it: `GroupInput` and `GroupOutput` (defined in
`vime.temporal.group_contract`, below the training workflow's state that carries them), and
`summarize`, which builds a `GroupOutput` from a group's samples.

Standard library and `vime.types` only: workflows import this module.
"""

from __future__ import annotations

from vime.sample_summary import failure_of, finish_of, preview as preview_text, sample_attempts
from vime.temporal.group_contract import GroupInput, GroupOutput, SampleInput
from vime.types import Sample

__all__ = ["GroupInput", "GroupOutput", "SampleInput", "hook_failures", "sample_previews", "summarize"]

PREVIEW_SAMPLES, PREVIEW_PROMPT_CHARS, PREVIEW_RESPONSE_CHARS = 16, 160, 320


def summarize(position: int, ids: list[str], results: list[list[Sample]], keep: bool = True,
              reason: str | None = None, *, preview: bool = True, earlier: bool = False) -> GroupOutput:
    """The small summary of a stored group that travels back through Temporal (with `preview`,
    the short texts its workflow puts in its memo for the Web UI)."""
    samples = [s for rollout in results for s in rollout]
    infra = [s for s in samples if (s.metadata or {}).get("infra_failure")]
    errors = [s for s in samples if s.status == Sample.Status.FAILED and s not in infra]
    rewards = [r[-1].reward for r in results if r and isinstance(r[-1].reward, (int, float))
               and not (r[-1].metadata or {}).get("infra_failure")]
    metas = [s.metadata or {} for s in errors]
    first = next((m for m in metas if m.get("hook_failure")), metas[0] if metas else None)
    first_error = None
    if first is not None:  # a hook's failure names itself; other errors are named here
        first_error = first.get("hook_failure") or f"{first.get('error_source', 'generate')} failed: " \
            f"{first.get('error')}"
    failed = bool(samples) and len(infra) == len(samples)
    return GroupOutput(position, ids, keep=keep and not failed, filter_reason=reason,
                       reward_mean=sum(rewards) / len(rewards) if rewards else None,
                       status="failed" if failed else "completed", samples=len(samples),
                       errors=len(errors), infra=len(infra), first_error=first_error,
                       failed=hook_failures(results), earlier=earlier,
                       preview=sample_previews(ids, results) if preview else None)


def hook_failures(results: list[list[Sample]]) -> int:
    """Samples of the group that a hook failed (raised, timed out)."""
    return sum(1 for r in results for s in r if (s.metadata or {}).get("hook_failure"))


def sample_previews(ids: list[str], results: list[list[Sample]]) -> list[dict]:
    """What the Web UI shows of stored rollouts (`ids`, each its samples in order) in their
    workflow's memo, one entry per sample (the first `PREVIEW_SAMPLES`): its key (`vime show
    RUN KEY`), reward, status and finish reason, what it is in its rollout (a multi-agent role
    and turn, a multi-turn sample's number of turns), which activity attempt and worker sampled
    it (`sampled_by`, see `vime.sample_summary.SAMPLED_BY`), a failure (never a truncation: that
    is a finish reason) and the start of its prompt and response."""
    shown = [(f"{rid}/{i}", s) for rid, rollout in zip(ids, results) for i, s in enumerate(rollout)]
    return [_preview(key, s) for key, s in shown[:PREVIEW_SAMPLES]]


def _preview(key: str, s: Sample) -> dict:
    meta = s.metadata or {}
    failure, cause = failure_of(s.status.value, meta)
    turns = meta.get("turns")
    sampled_by, worker = sample_attempts(meta)
    where = {"role": meta.get("role"), "turn": meta.get("turn"),
             "turns": len(turns) if isinstance(turns, list) else None,
             "sampled_by": sampled_by or None, "worker": worker or None}
    return {"sample": key, "reward": s.reward if isinstance(s.reward, int | float) else None,
            "status": s.status.value, **({"finish": finish} if (finish := finish_of(s.status.value)) else {}),
            **{k: v for k, v in where.items() if v is not None},
            "prompt": preview_text(s.prompt, PREVIEW_PROMPT_CHARS),
            "response": preview_text(s.response, PREVIEW_RESPONSE_CHARS),
            **({"failure": f"{failure}: {cause}"[:200] if cause else failure} if failure else {})}
