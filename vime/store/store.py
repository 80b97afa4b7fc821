"""`SampleStore`: the claim check for Temporal.

Workflows pass `SampleRef`s (ids and small summaries); token ids, loss masks and log-probs live
here. Every write is idempotent, because Temporal retries activities:

- `write_rollout(s)`: a rollout is stored once, all its siblings in one transaction; writing it
  again (a retry, or a concurrent duplicate) stores nothing and returns the refs of what is
  stored. The first write wins, even if a retry generated different samples.
- `mark_trained`: a sample is consumed by exactly one train step; repeating that step is a
  no-op, another step raises `AlreadyTrainedError`.
- `append_turn`: a turn is stored once; turns are 0, 1, 2, ... without gaps, so a retried
  agent rollout resumes at `last_turn() + 1`.

Bad input (`SampleError`, a `ConfigError`) is rejected before any transaction starts. A run must
exist (`ensure_run`) before anything is written under it, so a mistyped run id fails loudly.
One `SampleStore` per process; it is safe to share between threads.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from vime.errors import ConfigError
from vime.store import codec
from vime.store.engine import make_engine, resolve_url, shown, write_transaction
from vime.store.errors import AlreadyTrainedError, MissingSampleError, StoreError
from vime.store.migrate import upgrade_to_head
from vime.store.models import RUN_ID_LENGTH, RunRow, SampleRow, TurnRow, utcnow
from vime.store.rows import (
    REF_COLUMNS,
    SAMPLE_COLUMNS,
    TURN_COLUMNS,
    check_json,
    check_rollout_id,
    parse_status,
    row_to_ref,
    row_to_sample,
    sample_row,
    turn_row,
)
from vime.types import Sample, SampleError, SampleRef

_CHUNK = 500  # keys per IN (...): old SQLite builds allow 999 bound parameters per statement
_WRITE_ATTEMPTS = 3

T = TypeVar("T")
StatusFilter = Sample.Status | str | Iterable[Sample.Status | str] | None


@dataclass(frozen=True)
class Turn:
    """One stored trajectory turn; `loss_mask` and `log_probs` align with `token_ids`."""

    turn: int
    token_ids: list[int]
    loss_mask: list[int]
    log_probs: list[float] | None
    meta: dict[str, Any]


class SampleStore:
    """Samples and trajectory turns of training runs, in SQLite (default) or any SQL database."""

    def __init__(self, engine: Engine) -> None:
        """Wrap an engine whose schema is already at head; `SampleStore.open` is the usual way in."""
        self._engine = engine
        self._known_runs: set[str] = set()
        self._closed = False

    @classmethod
    def open(cls, target: str | os.PathLike[str], *, busy_timeout_s: float = 30.0) -> SampleStore:
        """Open (creating and migrating as needed) the store at a run directory or SQLAlchemy URL.

        A directory means `sqlite:///<dir>/vime.db`. `busy_timeout_s` is how long an SQLite
        writer waits for another process's write lock before failing.
        """
        url = resolve_url(target)
        engine = make_engine(url, busy_timeout_s=busy_timeout_s)
        try:
            upgrade_to_head(engine)
        except DBAPIError as exc:
            engine.dispose()
            raise ConfigError(
                f"cannot open store {shown(url)!r} ({exc.orig}); check that the database is reachable and "
                f"the URL's host, port, user, password and database name are right (for SQLite: that the "
                f"directory is writable)"
            ) from None
        except BaseException:
            engine.dispose()
            raise
        return cls(engine)

    @property
    def url(self) -> str:
        """Where the store lives, password hidden."""
        return shown(self._engine.url)

    @property
    def engine(self) -> Engine:
        return self._live()

    def close(self) -> None:
        """Release connections; the store cannot be used afterwards. Closing twice is fine."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> SampleStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SampleStore({self.url!r}{', closed' if self._closed else ''})"

    # ---- runs -----------------------------------------------------------------------------

    def ensure_run(self, run_id: str, config: Mapping[str, Any] | None = None) -> dict[str, Any] | None:
        """Create run `run_id` unless it exists; return its stored config.

        The config stored is the one given when the run was created; later calls (a resumed
        run) do not change it.
        """
        run_id = _check_run_id(run_id)
        config_json = None if config is None else check_json("run config", dict(config))

        def attempt() -> dict[str, Any] | None:
            with write_transaction(self._live()) as conn:
                stored = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first()
                if stored is not None:
                    return stored.config
                row = {"run_id": run_id, "config": config_json, "created_at": utcnow()}
                conn.execute(insert(RunRow.__table__), row)
                return config_json

        stored_config = _retry_on_conflict(attempt)
        self._known_runs.add(run_id)
        return stored_config

    # ---- samples --------------------------------------------------------------------------

    def write_rollout(self, run_id: str, rollout_id: str | int, samples: Sequence[Sample]) -> list[SampleRef]:
        """Store the siblings of one rollout under keys `f"{rollout_id}/{i}"`, once; return their refs."""
        rollout_id = check_rollout_id(rollout_id)
        return self.write_rollouts(run_id, {rollout_id: samples})[rollout_id]

    def write_rollouts(
        self, run_id: str, rollouts: Mapping[str | int, Sequence[Sample]]
    ) -> dict[str, list[SampleRef]]:
        """Store many rollouts in one transaction (one bulk insert); return refs per rollout id.

        Rollouts already stored are left as they are and their stored refs returned. Every
        sample is validated and encoded first: one bad sample and nothing is written.
        """
        run_id = _check_run_id(run_id)
        encoded: dict[str, list[dict[str, Any]]] = {}
        for raw_id, samples in rollouts.items():
            rollout_id = check_rollout_id(raw_id)
            if rollout_id in encoded:
                raise SampleError(f"rollout {rollout_id!r} appears twice in one write (as {raw_id!r})")
            if isinstance(samples, Sample) or not samples:
                raise SampleError(f"rollout {rollout_id!r}: pass a non-empty list of Samples, got {samples!r:.80}")
            encoded[rollout_id] = [sample_row(run_id, rollout_id, i, s) for i, s in enumerate(samples)]
        self._require_run(run_id)
        now = utcnow()

        def attempt() -> dict[str, list[SampleRef]]:
            with write_transaction(self._live()) as conn:
                stored = _stored_refs(conn, run_id, list(encoded))
                new_rows = [row for rid, rows in encoded.items() if rid not in stored for row in rows]
                for row in new_rows:
                    row["created_at"] = now
                if new_rows:
                    conn.execute(insert(SampleRow.__table__), new_rows)
            return stored

        stored = _retry_on_conflict(attempt)
        return {
            rid: stored.get(rid) or [row_to_ref(run_id, row) for row in rows] for rid, rows in encoded.items()
        }

    def rollout_refs(self, run_id: str, rollout_id: str | int) -> list[SampleRef]:
        """Refs of a stored rollout's siblings in order; `[]` when it is not stored."""
        rollout_id = check_rollout_id(rollout_id)
        with self._live().connect() as conn:
            return _stored_refs(conn, run_id, [rollout_id]).get(rollout_id, [])

    def read_samples(self, run_id: str, keys: Iterable[str | SampleRef]) -> list[Sample]:
        """The samples under `keys` (or refs), in the order asked; raises `MissingSampleError`."""
        wanted = [_key(run_id, k) for k in keys]
        found: dict[str, Sample] = {}
        with self._live().connect() as conn:
            for chunk in _chunks(list(dict.fromkeys(wanted))):
                query = _select_samples().where(SampleRow.run_id == run_id, SampleRow.key.in_(chunk))
                for row in conn.execute(query).mappings():
                    found[row["key"]] = row_to_sample(row)
        missing = [k for k in dict.fromkeys(wanted) if k not in found]
        if missing:
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise MissingSampleError(
                f"run {run_id!r} has no sample {missing[0]!r}{more} in store {self.url!r}; "
                f"keys come from the SampleRefs that write_rollout returned"
            )
        handed_out: set[str] = set()
        result = []
        for key in wanted:
            result.append(copy.deepcopy(found[key]) if key in handed_out else found[key])
            handed_out.add(key)
        return result

    def read_rollout(self, run_id: str, rollout_id: str | int) -> list[Sample]:
        """The siblings of one rollout in order; raises `MissingSampleError` if it is not stored."""
        rollout_id = check_rollout_id(rollout_id)
        with self._live().connect() as conn:
            query = (
                _select_samples()
                .where(SampleRow.run_id == run_id, SampleRow.rollout_id == rollout_id)
                .order_by(SampleRow.sibling)
            )
            samples = [row_to_sample(row) for row in conn.execute(query).mappings()]
        if not samples:
            raise MissingSampleError(f"run {run_id!r} has no rollout {rollout_id!r} in store {self.url!r}")
        return samples

    def iter_samples(
        self,
        run_id: str,
        *,
        status: StatusFilter = None,
        untrained: bool = False,
        rollout_id: str | int | None = None,
        batch_size: int = 256,
    ) -> Iterator[tuple[SampleRef, Sample]]:
        """Yield (ref, sample) in write order, filtered by status, not-yet-trained, or rollout.

        Reads `batch_size` rows per short transaction, so a long iteration holds no database
        snapshot open; samples written meanwhile may or may not appear.
        """
        if batch_size < 1:
            raise ConfigError(f"iter_samples: batch_size {batch_size!r} must be at least 1")
        where = _filters(run_id, status, untrained, rollout_id)
        last_id = 0
        while True:
            query = (
                _select_samples(SampleRow.id.label("row_id"))
                .where(*where, SampleRow.id > last_id)
                .order_by(SampleRow.id)
                .limit(batch_size)
            )
            with self._live().connect() as conn:
                rows = conn.execute(query).mappings().all()
            for row in rows:
                yield row_to_ref(run_id, row), row_to_sample(row)
            if len(rows) < batch_size:
                return
            last_id = rows[-1]["row_id"]

    def count_samples(
        self,
        run_id: str,
        *,
        status: StatusFilter = None,
        untrained: bool = False,
        rollout_id: str | int | None = None,
    ) -> int:
        """How many samples of the run match the filters (same filters as `iter_samples`)."""
        query = select(func.count()).select_from(SampleRow).where(*_filters(run_id, status, untrained, rollout_id))
        with self._live().connect() as conn:
            return int(conn.execute(query).scalar_one())

    def mark_trained(self, run_id: str, keys: Iterable[str | SampleRef], step: int) -> int:
        """Record that train step `step` consumed these samples; return how many were newly marked.

        Idempotent for the same step (a retried train step). A sample already marked with a
        different step raises `AlreadyTrainedError` and nothing is marked: that batch would
        train a sample twice.
        """
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError(f"mark_trained: step {step!r} must be an int >= 0")
        wanted = list(dict.fromkeys(_key(run_id, k) for k in keys))
        with write_transaction(self._live()) as conn:
            marked: dict[str, int | None] = {}
            for chunk in _chunks(wanted):
                query = select(SampleRow.key, SampleRow.trained_step).where(
                    SampleRow.run_id == run_id, SampleRow.key.in_(chunk)
                )
                for key, trained_step in conn.execute(query):
                    marked[key] = trained_step
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
            for chunk in _chunks(todo):
                conn.execute(
                    update(SampleRow)
                    .where(SampleRow.run_id == run_id, SampleRow.key.in_(chunk), SampleRow.trained_step.is_(None))
                    .values(trained_step=step)
                )
        return len(todo)

    # ---- trajectory turns -----------------------------------------------------------------

    def append_turn(
        self,
        run_id: str,
        rollout_id: str | int,
        turn: int,
        token_ids: Sequence[int],
        loss_mask: Sequence[int],
        log_probs: Sequence[float] | None = None,
        meta: Mapping[str, Any] | None = None,
    ) -> bool:
        """Store turn `turn` of an agent rollout; True if stored now, False if it was already.

        Turns must come in order: `turn` is 0 or `last_turn() + 1` (or an already stored turn,
        which is left unchanged: the first write wins, as for samples).
        """
        run_id = _check_run_id(run_id)
        rollout_id = check_rollout_id(rollout_id)
        row = turn_row(run_id, rollout_id, turn, token_ids, loss_mask, log_probs, meta)
        row["created_at"] = utcnow()
        self._require_run(run_id)
        try:
            with write_transaction(self._live()) as conn:
                last = _last_turn(conn, run_id, rollout_id)
                if last is not None and turn <= last:
                    return False
                expected = 0 if last is None else last + 1
                if turn != expected:
                    raise StoreError(
                        f"append_turn: turn {turn} of rollout {rollout_id!r} (run {run_id!r}) would leave a gap; "
                        f"the next turn is {expected} (resume at last_turn() + 1)"
                    )
                conn.execute(insert(TurnRow.__table__), row)
            return True
        except IntegrityError:  # the same turn appended concurrently
            last = self.last_turn(run_id, rollout_id)
            if last is not None and turn <= last:
                return False
            raise

    def read_turns(self, run_id: str, rollout_id: str | int, *, start: int = 0) -> list[Turn]:
        """Stored turns of a rollout from `start` on, in order; `[]` when none are stored."""
        rollout_id = check_rollout_id(rollout_id)
        query = (
            select(*(c.label(name) for name, c in TURN_COLUMNS.items()))
            .where(TurnRow.run_id == run_id, TurnRow.rollout_id == rollout_id, TurnRow.turn >= start)
            .order_by(TurnRow.turn)
        )
        with self._live().connect() as conn:
            rows = conn.execute(query).mappings().all()
        return [
            Turn(
                turn=row["turn"],
                token_ids=codec.decode_int32(row["token_ids"]),
                loss_mask=codec.decode_uint8(row["loss_mask"]),
                log_probs=codec.decode_optional(codec.decode_float32, row["log_probs"]),
                meta=row["meta"],
            )
            for row in rows
        ]

    def last_turn(self, run_id: str, rollout_id: str | int) -> int | None:
        """The highest stored turn of a rollout, None when it has none (start at turn 0)."""
        rollout_id = check_rollout_id(rollout_id)
        with self._live().connect() as conn:
            return _last_turn(conn, run_id, rollout_id)

    # ---- internals ------------------------------------------------------------------------

    def _live(self) -> Engine:
        if self._closed:
            raise StoreError(f"store {self.url!r} is closed; open it again with SampleStore.open")
        return self._engine

    def _require_run(self, run_id: str) -> None:
        if run_id in self._known_runs:
            return
        with self._live().connect() as conn:
            exists = conn.execute(select(RunRow.run_id).where(RunRow.run_id == run_id)).first()
        if exists is None:
            raise StoreError(
                f"run {run_id!r} is not in store {self.url!r}; create it first with store.ensure_run({run_id!r})"
            )
        self._known_runs.add(run_id)


def _retry_on_conflict(attempt: Callable[[], T]) -> T:
    """Run a write transaction again when a concurrent writer inserted the same unique key.

    The retry sees the other writer's committed rows and so stores nothing twice.
    """
    for tries_left in reversed(range(_WRITE_ATTEMPTS)):
        try:
            return attempt()
        except IntegrityError:
            if not tries_left:
                raise
    raise AssertionError("unreachable")


def _check_run_id(run_id: str) -> str:
    if not isinstance(run_id, str) or not run_id or len(run_id) > RUN_ID_LENGTH:
        raise ConfigError(f"run_id {run_id!r} must be a non-empty str of at most {RUN_ID_LENGTH} characters")
    return run_id


def _key(run_id: str, key: str | SampleRef) -> str:
    if isinstance(key, SampleRef):
        if key.run_id != run_id:
            raise ConfigError(f"SampleRef {key.key!r} belongs to run {key.run_id!r}, not to run {run_id!r}")
        return key.key
    if not isinstance(key, str):
        raise ConfigError(f"sample key {key!r} must be a str like 'rollout-id/0' or a SampleRef")
    return key


def _chunks(items: list[str]) -> Iterator[list[str]]:
    for start in range(0, len(items), _CHUNK):
        yield items[start : start + _CHUNK]


def _select_samples(*extra):
    return select(*(column.label(name) for name, column in SAMPLE_COLUMNS.items()), *extra)


def _stored_refs(conn: Connection, run_id: str, rollout_ids: list[str]) -> dict[str, list[SampleRef]]:
    refs: dict[str, list[SampleRef]] = {}
    columns = [column.label(name) for name, column in REF_COLUMNS.items()]
    for chunk in _chunks(rollout_ids):
        query = (
            select(*columns)
            .where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
            .order_by(SampleRow.rollout_id, SampleRow.sibling)
        )
        for row in conn.execute(query).mappings():
            refs.setdefault(row["rollout_id"], []).append(row_to_ref(run_id, row))
    return refs


def _filters(run_id: str, status: StatusFilter, untrained: bool, rollout_id: str | int | None) -> list:
    where: list = [SampleRow.run_id == run_id]
    if status is not None:
        statuses = [status] if isinstance(status, str) else list(status)
        where.append(SampleRow.status.in_([parse_status(v, what="status filter").value for v in statuses]))
    if untrained:
        where.append(SampleRow.trained_step.is_(None))
    if rollout_id is not None:
        where.append(SampleRow.rollout_id == check_rollout_id(rollout_id))
    return where


def _last_turn(conn: Connection, run_id: str, rollout_id: str) -> int | None:
    query = select(func.max(TurnRow.turn)).where(TurnRow.run_id == run_id, TurnRow.rollout_id == rollout_id)
    return conn.execute(query).scalar_one()
