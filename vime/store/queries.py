"""The SQL behind `SampleStore`: input checks, chunked queries, and the reads and writes its
methods share, one function each (kept apart so `store.py` reads as the API)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, select, update

from vime.errors import ConfigError
from vime.store.errors import AlreadyTrainedError, MissingSampleError
from vime.store.models import RUN_ID_LENGTH, SampleRow, StepManifestRow, TurnRow
from vime.store.rows import REF_COLUMNS, SAMPLE_COLUMNS, check_rollout_id, parse_status, row_to_ref
from vime.types import Sample, SampleRef

_CHUNK = 500  # keys per IN (...): old SQLite builds allow 999 bound parameters per statement

StatusFilter = Sample.Status | str | Iterable[Sample.Status | str] | None


@dataclass(frozen=True)
class Turn:
    """One stored trajectory turn; `loss_mask` and `log_probs` align with `token_ids`."""

    turn: int
    token_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float] | None
    meta: dict[str, Any]


@dataclass(frozen=True)
class StepManifest:
    """What train step `step` of run `run_id` trains on, as recorded by `write_step_manifest`.

    `rollout_ids` are in training order (each stands for all its siblings); `weight_version`
    is the policy version the rollouts were started under; `meta` is a small JSON summary
    (groups, samples, filter counts). Never changes once stored.
    """

    run_id: str
    step: int
    rollout_ids: list[str]
    weight_version: int
    meta: dict[str, Any]


def check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or len(run_id) > RUN_ID_LENGTH:
        raise ConfigError(f"run_id {run_id!r} must be a non-empty str of at most {RUN_ID_LENGTH} characters")
    return run_id


def check_step(what: str, step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"{what}: step {step!r} must be an int >= 0")


def check_seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise ConfigError(f"store {name} {value!r} must be a number of seconds >= 0")
    return value


def key(run_id: str, key: str | SampleRef) -> str:
    if isinstance(key, SampleRef):
        if key.run_id != run_id:
            raise ConfigError(f"SampleRef {key.key!r} belongs to run {key.run_id!r}, not to run {run_id!r}")
        return key.key
    if not isinstance(key, str):
        raise ConfigError(f"sample key {key!r} must be a str like 'rollout-id/0' or a SampleRef")
    return key


def chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def select_samples(*extra):
    return select(*(column.label(name) for name, column in SAMPLE_COLUMNS.items()), *extra)


def stored_refs(conn: Connection, run_id: str, rollout_ids: list[str]) -> dict[str, list[SampleRef]]:
    refs: dict[str, list[SampleRef]] = {}
    columns = [column.label(name) for name, column in REF_COLUMNS.items()]
    for chunk in chunks(rollout_ids):
        query = (
            select(*columns)
            .where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
            .order_by(SampleRow.rollout_id, SampleRow.sibling)
        )
        for row in conn.execute(query).mappings():
            refs.setdefault(row["rollout_id"], []).append(row_to_ref(run_id, row))
    return refs


def filters(run_id: str, status: StatusFilter, untrained: bool, rollout_id: str | int | None,
            evaluation: bool | None = False, eval_step: int | None = None) -> list:
    where: list = [SampleRow.run_id == run_id]
    if eval_step is not None:
        where.append(SampleRow.eval_step == eval_step)
    elif evaluation is not None:
        where.append(SampleRow.eval_step.is_not(None) if evaluation else SampleRow.eval_step.is_(None))
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        where.append(SampleRow.status.in_([parse_status(v, what="status filter").value for v in statuses]))
    if untrained:
        where.append(SampleRow.trained_step.is_(None))
    if rollout_id is not None:
        where.append(SampleRow.rollout_id == check_rollout_id(rollout_id))
    return where


def mark_trained(conn: Connection, run_id: str, wanted: list[str], step: int) -> int:
    """Set `trained_step = step` on samples `wanted` (distinct keys), all or none; see `mark_trained`."""
    marked: dict[str, int | None] = {}
    evals: dict[str, int] = {}
    for chunk in chunks(wanted):
        query = select(SampleRow.key, SampleRow.trained_step, SampleRow.eval_step).where(
            SampleRow.run_id == run_id, SampleRow.key.in_(chunk)
        )
        for key, trained_step, eval_step in conn.execute(query):
            marked[key] = trained_step
            if eval_step is not None:
                evals[key] = eval_step
    if evals:
        key, eval_step = next(iter(evals.items()))
        raise ConfigError(f"mark_trained: sample {key!r} of run {run_id!r} is an eval sample (the eval round at step "
                          f"{eval_step}); eval samples are never trained ({len(evals)} in this batch)")
    missing = [k for k in wanted if k not in marked]
    if missing:
        raise MissingSampleError(
            f"mark_trained: run {run_id!r} has no sample {missing[0]!r}"
            + (f" (and {len(missing) - 1} more)" if len(missing) > 1 else "")
        )
    twice = {k: s for k, s in marked.items() if s is not None and s != step}
    if twice:
        key, earlier = next(iter(twice.items()))
        raise AlreadyTrainedError(
            f"mark_trained: sample {key!r} of run {run_id!r} was trained at step {earlier}; marking it "
            f"for step {step} would train it twice ({len(twice)} of the {len(wanted)} samples were trained "
            f"before); drop them from the batch, e.g. pick samples with iter_samples(untrained=True)"
        )
    todo = [k for k in wanted if marked[k] is None]
    for chunk in chunks(todo):
        conn.execute(
            update(SampleRow)
            .where(SampleRow.run_id == run_id, SampleRow.key.in_(chunk), SampleRow.trained_step.is_(None))
            .values(trained_step=step)
        )
    return len(todo)


def read_manifest(conn: Connection, run_id: str, step: int) -> StepManifest | None:
    query = select(
        StepManifestRow.rollout_ids, StepManifestRow.weight_version, StepManifestRow.meta
    ).where(StepManifestRow.run_id == run_id, StepManifestRow.step == step)
    row = conn.execute(query).first()
    if row is None:
        return None
    return StepManifest(run_id, step, list(row.rollout_ids), int(row.weight_version), dict(row.meta or {}))


def last_turn(conn: Connection, run_id: str, rollout_id: str) -> int | None:
    query = select(func.max(TurnRow.turn)).where(TurnRow.run_id == run_id, TurnRow.rollout_id == rollout_id)
    return conn.execute(query).scalar_one()
