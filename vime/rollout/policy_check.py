"""Is a sample on the policy its step expects? The check that keeps a restart from training on
samples of the wrong weights.

vLLM reports, for every response, the weight versions that produced it (`Sample.weight_versions`:
spans like `{"version": "5", ...}`; `"default"` until a server is first told a version, i.e.
a server that booted from the base checkpoint). A group is started under the policy version
the workflow knew then (`RolloutInput.weight_version`), which is within the step's staleness
bound by construction; the servers only move forward from there. So a response whose version is
*older* than that came from a server that restarted on other weights and was not synced yet
(the relaunched vLLM of a SIGTERM'd launch boots the base checkpoint while the run stands at
step 5). Such a group must be sampled again once the trainer has pushed the current policy,
never stored and trained.

`"default"` counts as version 0: a run's first policy is the checkpoint the servers boot from.
A sample without any reported version (a custom generate hook calling its own engine) cannot be
checked and passes.
"""

from __future__ import annotations

from collections.abc import Iterable

from vime.engine.live_weights import BASE_VERSION
from vime.errors import ServiceError
from vime.log import get_logger
from vime.types import Sample

log = get_logger(__name__)


class StalePolicyError(ServiceError):
    """A group was sampled (at least partly) under weights older than its step allows. A
    `ServiceError`, so Temporal retries the activity: the next try samples again, by then from
    servers the trainer has synced."""


def sampled_versions(sample: Sample) -> list[int | None]:
    """The policy versions that produced `sample`'s response; None for one that is not a number
    (not a version vime pushed)."""
    found = []
    for span in sample.weight_versions or []:
        raw = span.get("version") if isinstance(span, dict) else span
        if raw is None:
            continue
        raw = str(raw)
        found.append(0 if raw == BASE_VERSION else int(raw) if raw.lstrip("-").isdigit() else None)
    return found


def is_stale(sample: Sample, min_version: int) -> bool:
    """Whether any part of `sample` was sampled under a version older than `min_version`."""
    return any(v is None or v < min_version for v in sampled_versions(sample))


def check_on_policy(samples: Iterable[Sample], min_version: int, what: str) -> None:
    """Raise `StalePolicyError` when any of `samples` is stale: `what` names the group."""
    stale = [s for s in samples if is_stale(s, min_version)]
    if stale:
        seen = sorted({str(span.get("version") if isinstance(span, dict) else span)
                       for s in stale for span in s.weight_versions or []})
        log.warning("rollout.stale_policy", group=what, stale=len(stale), versions=seen, needs=min_version)
        raise StalePolicyError(
            f"{what}: {len(stale)} sample(s) came from policy version {', '.join(seen)} but the step needs "
            f"version {min_version} or newer (a server restarted on other weights and is not synced yet); "
            "sampling again once the trainer has pushed the current policy")
