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

from vime.engine.weight_sync.live_weights import BASE_VERSION
from vime.errors import ServiceError
from vime.log import get_logger
from vime.sample_summary import versions_text
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


def stale_report(samples: Iterable[Sample], min_version: int) -> str | None:
    """`"N sample(s) came from policy version V, the step needs version M or newer"` when any of `samples`
    is stale, else None: the one wording of the rollout side's retry and the trainer's refusal."""
    stale = [s for s in samples if is_stale(s, min_version)]
    if not stale:
        return None
    seen = sorted({versions_text(s.weight_versions) for s in stale})
    return f"{len(stale)} sample(s) came from policy version {', '.join(seen)}, the step needs version {min_version} or newer"


def check_on_policy(samples: Iterable[Sample], min_version: int, what: str) -> None:
    """Raise `StalePolicyError` when any of `samples` is stale: `what` names the group."""
    report = stale_report(samples, min_version)
    if report:
        log.warning("rollout.stale_policy", group=what, report=report)
        raise StalePolicyError(f"{what}: {report} (a server restarted on other weights and is not synced yet); "
                               "sampling again once the trainer has pushed the current policy")


def check_one_version(samples: Iterable[Sample], version: int, what: str) -> None:
    """Every sample was sampled by policy `version` and no other (an eval round's rule); raises
    `StalePolicyError` (retried: sampled again once the servers hold the round's weights). A
    sample whose engine reports no version (a hook's own engine) cannot be checked and passes."""
    wrong = sorted({str(v) for s in samples for v in sampled_versions(s) if v != version})
    if wrong:
        raise StalePolicyError(f"{what}: sampled by policy version {', '.join(wrong)}, the round evaluates version "
                               f"{version} (a server restarted on other weights); sampling again")
