"""The group contract as an environment sees it: `GroupInput` and `GroupOutput` (defined in
`vime.temporal.group_contract`, below the training workflow's state that carries them), and
`summarize`, which builds a `GroupOutput` from a group's samples.

Standard library and `vime.types` only: workflows import this module.
"""

from __future__ import annotations

from vime.sample_summary import failure_of, preview as preview_text
from vime.temporal.group_contract import GroupInput, GroupOutput, SampleInput
from vime.types import Sample

__all__ = ["GroupInput", "GroupOutput", "SampleInput", "hook_failures", "summarize"]

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
                       preview=_preview(ids, results) if preview else None)


def hook_failures(results: list[list[Sample]]) -> int:
    """Samples of the group that a hook failed (raised, timed out)."""
    return sum(1 for r in results for s in r if (s.metadata or {}).get("hook_failure"))


def _preview(ids: list[str], results: list[list[Sample]]) -> list[dict]:
    shown = [(f"{rid}/{i}", s) for rid, rollout in zip(ids, results) for i, s in enumerate(rollout)]
    previews = []
    for key, s in shown[:PREVIEW_SAMPLES]:
        failure, cause = failure_of(s.status.value, s.metadata or {})
        previews.append({"sample": key, "reward": s.reward if isinstance(s.reward, int | float) else None,
                         "status": s.status.value, "prompt": preview_text(s.prompt, PREVIEW_PROMPT_CHARS),
                         "response": preview_text(s.response, PREVIEW_RESPONSE_CHARS),
                         **({"failure": f"{failure}: {cause}"[:200]} if failure else {})})
    return previews
