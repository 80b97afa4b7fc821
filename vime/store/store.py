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
- `write_step_manifest`: a train step's content (its rollout ids, in order) is recorded once;
  the first write wins, so a retried or replayed step trains on the same samples, and the
  training workflow passes only (run_id, step) however large the batch.

Bad input (`SampleError`, a `ConfigError`) is rejected before any transaction starts. A run must
exist (`ensure_run`) before anything is written under it, so a mistyped run id fails loudly.
A locked SQLite store is waited out (see `vime.store.engine`): a write blocked by another
process's lock finishes once the lock is released, up to `lock_wait_s`.
One `SampleStore` per process; it is safe to share between threads. Its calls block: from
async code use `activities.store_calls.store_call`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, func, insert, select, update
from sqlalchemy.exc import DBAPIError, IntegrityError

from vime.errors import ConfigError
from vime.store import codec
from vime.store import queries as q
from vime.store import rescores
from vime.store.queries import StatusFilter, StepManifest, Turn
from vime.store.engine import (
    DEFAULT_BUSY_TIMEOUT_S,
    DEFAULT_LOCK_WAIT_S,
    make_engine,
    resolve_url,
    run_read,
    run_write,
    shown,
)
from vime.store.errors import MissingManifestError, MissingSampleError, StoreError
from vime.store.migrate import upgrade_to_head
from vime.store.models import RunRow, SampleRow, StepManifestRow, TurnRow, utcnow
from vime.store.rows import (
    TURN_COLUMNS,
    check_json,
    check_rollout_id,
    row_to_ref,
    row_to_sample,
    sample_row,
    turn_row,
)
from vime.types import Sample, SampleError, SampleRef

_WRITE_ATTEMPTS = 3

T = TypeVar("T")


class SampleStore:
    """Samples and trajectory turns of training runs, in SQLite (default) or any SQL database."""

    def __init__(self, engine: Engine, *, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> None:
        """Wrap an engine whose schema is already at head; `SampleStore.open` is the usual way in."""
        self._engine = engine
        self._lock_wait_s = q.check_seconds("lock_wait_s", lock_wait_s)
        self._known_runs: set[str] = set()
        self._closed = False

    @classmethod
    def open(
        cls,
        target: str | os.PathLike[str],
        *,
        busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S,
        lock_wait_s: float = DEFAULT_LOCK_WAIT_S,
    ) -> SampleStore:
        """Open (creating and migrating as needed) the store at a run directory or SQLAlchemy URL.

        A directory means `sqlite:///<dir>/vime.db`. SQLite only: `busy_timeout_s` is how long
        one statement waits for another process's lock before SQLite reports it locked;
        `lock_wait_s` is how long a transaction keeps being retried after that (from its first
        try) before `StoreLockedError`. The defaults (300 s, 600 s) outlast a lock held for
        minutes; a write still fails when a lock outlives both.
        """
        q.check_seconds("lock_wait_s", lock_wait_s)
        url = resolve_url(target)
        engine = make_engine(url, busy_timeout_s=busy_timeout_s)
        try:
            upgrade_to_head(engine, lock_wait_s=lock_wait_s)
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
        return cls(engine, lock_wait_s=lock_wait_s)

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
        run_id = q.check_run_id(run_id)
        config_json = None if config is None else check_json("run config", dict(config))

        def work(conn: Connection) -> dict[str, Any] | None:
            stored = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first()
            if stored is not None:
                return stored.config
            row = {"run_id": run_id, "config": config_json, "created_at": utcnow()}
            conn.execute(insert(RunRow.__table__), row)
            return config_json

        stored_config = self._write(work)
        self._known_runs.add(run_id)
        return stored_config

    def register_run(self, run_id: str, argv: Sequence[str], config: Mapping[str, Any] | None = None) -> None:
        """Record the flags run `run_id` was (re)started with (and the config parsed from them),
        creating the run if it is new.

        Workers that serve many runs build a run's config from the flags (`vime.run_args`); a run
        restarted with other flags (another engine address, more steps) replaces them.
        """
        run_id = q.check_run_id(run_id)
        argv = [str(a) for a in argv]
        fields = {**(check_json("run config", dict(config)) if config else {}), "argv": argv}

        def work(conn: Connection) -> None:
            stored = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first()
            if stored is None:
                conn.execute(insert(RunRow.__table__), {"run_id": run_id, "config": fields, "created_at": utcnow()})
            else:
                conn.execute(update(RunRow).where(RunRow.run_id == run_id).values(
                    config={**(stored.config or {}), **fields}))

        self._write(work)
        self._known_runs.add(run_id)

    def run_argv(self, run_id: str) -> list[str] | None:
        """The flags run `run_id` was last started with (None: no such run, or one never registered)."""
        row = self._read(lambda conn: conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first())
        return None if row is None or not isinstance(row.config, dict) else row.config.get("argv")

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
        run_id = q.check_run_id(run_id)
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

        def work(conn: Connection) -> dict[str, list[SampleRef]]:
            stored = q.stored_refs(conn, run_id, list(encoded))
            new_rows = [row for rid, rows in encoded.items() if rid not in stored for row in rows]
            for row in new_rows:
                row["created_at"] = now
            if new_rows:
                conn.execute(insert(SampleRow.__table__), new_rows)
            return stored

        stored = self._write(work)
        return {
            rid: stored.get(rid) or [row_to_ref(run_id, row) for row in rows] for rid, rows in encoded.items()
        }

    def rollout_refs(self, run_id: str, rollout_id: str | int) -> list[SampleRef]:
        """Refs of a stored rollout's siblings in order; `[]` when it is not stored."""
        rollout_id = check_rollout_id(rollout_id)
        return self._read(lambda conn: q.stored_refs(conn, run_id, [rollout_id])).get(rollout_id, [])

    def read_samples(self, run_id: str, keys: Iterable[str | SampleRef]) -> list[Sample]:
        """The samples under `keys` (or refs), in the order asked; raises `MissingSampleError`."""
        wanted = [q.key(run_id, k) for k in keys]

        def work(conn: Connection) -> dict[str, Sample]:
            found: dict[str, Sample] = {}
            for chunk in q.chunks(list(dict.fromkeys(wanted))):
                query = q.select_samples().where(SampleRow.run_id == run_id, SampleRow.key.in_(chunk))
                for row in conn.execute(query).mappings():
                    found[row["key"]] = row_to_sample(row)
            return found

        found = self._read(work)
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
        query = (
            q.select_samples()
            .where(SampleRow.run_id == run_id, SampleRow.rollout_id == rollout_id)
            .order_by(SampleRow.sibling)
        )
        samples = self._read(lambda conn: [row_to_sample(row) for row in conn.execute(query).mappings()])
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
        where = q.filters(run_id, status, untrained, rollout_id)
        last_id = 0
        while True:
            query = (
                q.select_samples(SampleRow.id.label("row_id"))
                .where(*where, SampleRow.id > last_id)
                .order_by(SampleRow.id)
                .limit(batch_size)
            )
            rows = self._read(lambda conn, query=query: conn.execute(query).mappings().all())
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
        query = select(func.count()).select_from(SampleRow).where(*q.filters(run_id, status, untrained, rollout_id))
        return int(self._read(lambda conn: conn.execute(query).scalar_one()))

    def mark_trained(self, run_id: str, keys: Iterable[str | SampleRef], step: int) -> int:
        """Record that train step `step` consumed these samples; return how many were newly marked.

        Idempotent for the same step (a retried train step). A sample already marked with a
        different step raises `AlreadyTrainedError` and nothing is marked: that batch would
        train a sample twice.
        """
        q.check_step("mark_trained", step)
        wanted = list(dict.fromkeys(q.key(run_id, k) for k in keys))
        return self._write(lambda conn: q.mark_trained(conn, run_id, wanted, step))

    def trained_counts(self, run_id: str) -> dict[int, int]:
        """How many samples each train step consumed (`mark_trained`), by step, ascending.

        Steps that marked nothing are absent; `{}` for a run with nothing trained yet.
        """
        query = (
            select(SampleRow.trained_step, func.count())
            .where(SampleRow.run_id == run_id, SampleRow.trained_step.is_not(None))
            .group_by(SampleRow.trained_step)
            .order_by(SampleRow.trained_step)
        )
        return self._read(lambda conn: {int(step): int(count) for step, count in conn.execute(query)})

    # ---- step manifests -------------------------------------------------------------------

    def write_step_manifest(
        self,
        run_id: str,
        step: int,
        rollout_ids: Sequence[str | int],
        *,
        weight_version: int = 0,
        meta: Mapping[str, Any] | None = None,
    ) -> StepManifest:
        """Record what train step `step` trains on: these rollouts (all their siblings), in order.

        The first write wins: when the step already has a manifest (a retried or duplicated
        write), that one is returned unchanged, even if this call names other rollouts; train
        on what is returned. Otherwise every rollout id must be stored for the run
        (`MissingSampleError` names the first that is not, and nothing is written). The check
        and the insert are one transaction.
        """
        run_id = q.check_run_id(run_id)
        q.check_step("write_step_manifest", step)
        if isinstance(weight_version, bool) or not isinstance(weight_version, int) or weight_version < 0:
            raise ConfigError(f"write_step_manifest: weight_version {weight_version!r} must be an int >= 0")
        if isinstance(rollout_ids, str | bytes) or not isinstance(rollout_ids, Sequence):
            raise ConfigError(
                f"write_step_manifest: rollout_ids must be a list of rollout ids, got {rollout_ids!r:.80}"
            )
        if not rollout_ids:
            raise ConfigError(
                f"write_step_manifest: step {step} of run {run_id!r} has no rollouts; a step trains on at least one"
            )
        ids = [check_rollout_id(rid) for rid in rollout_ids]
        seen: set[str] = set()
        for rid in ids:
            if rid in seen:
                raise ConfigError(
                    f"write_step_manifest: rollout {rid!r} appears twice in step {step}; a rollout is trained once"
                )
            seen.add(rid)
        if meta is not None and not isinstance(meta, Mapping):
            raise ConfigError(f"write_step_manifest: meta must be a dict (a small JSON summary), got {meta!r:.80}")
        meta_json = check_json("step manifest meta", dict(meta or {}))
        self._require_run(run_id)
        now = utcnow()

        def work(conn: Connection) -> StepManifest:
            stored = q.read_manifest(conn, run_id, step)
            if stored is not None:
                return stored
            present: set[str] = set()
            for chunk in q.chunks(ids):
                query = (
                    select(SampleRow.rollout_id)
                    .where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
                    .distinct()
                )
                present.update(conn.execute(query).scalars())
            missing = [rid for rid in ids if rid not in present]
            if missing:
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise MissingSampleError(
                    f"write_step_manifest: run {run_id!r} has no rollout {missing[0]!r}{more} for step {step} "
                    f"in store {self.url!r}; write the rollouts (write_rollouts) before the step that trains on them"
                )
            row = {
                "run_id": run_id,
                "step": step,
                "rollout_ids": ids,
                "weight_version": weight_version,
                "meta": meta_json,
                "created_at": now,
            }
            conn.execute(insert(StepManifestRow.__table__), row)
            written = q.read_manifest(conn, run_id, step)  # as every later read will see it
            assert written is not None
            return written

        return self._write(work)

    def read_step_manifest(self, run_id: str, step: int) -> StepManifest | None:
        """The manifest recorded for train step `step`, None when the step has none yet."""
        q.check_step("read_step_manifest", step)
        return self._read(lambda conn: q.read_manifest(conn, run_id, step))

    def read_step_samples(self, run_id: str, step: int) -> list[Sample]:
        """The samples train step `step` trains on: each manifest rollout's siblings, in manifest order.

        Raises `MissingManifestError` when the step has no manifest. Manifest and samples are
        read in one snapshot.
        """
        q.check_step("read_step_samples", step)

        def work(conn: Connection) -> list[Sample]:
            manifest = self._require_manifest(conn, run_id, step)
            by_rollout: dict[str, list[Sample]] = {}
            for chunk in q.chunks(manifest.rollout_ids):
                query = (
                    q.select_samples()
                    .where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
                    .order_by(SampleRow.rollout_id, SampleRow.sibling)
                )
                for row in conn.execute(query).mappings():
                    by_rollout.setdefault(row["rollout_id"], []).append(row_to_sample(row))
            missing = [rid for rid in manifest.rollout_ids if rid not in by_rollout]
            if missing:  # only if rows were deleted behind the store's back
                raise MissingSampleError(
                    f"step {step} of run {run_id!r} names rollout {missing[0]!r}, which store {self.url!r} "
                    f"no longer holds"
                )
            return [sample for rid in manifest.rollout_ids for sample in by_rollout[rid]]

        return self._read(work)

    def mark_step_trained(self, run_id: str, step: int) -> int:
        """`mark_trained` for every sample of step `step`'s manifest; return how many were newly marked.

        Idempotent; `AlreadyTrainedError` (nothing marked) when a sample of the step was
        trained at another step; `MissingManifestError` when the step has no manifest.
        """
        q.check_step("mark_step_trained", step)

        def work(conn: Connection) -> int:
            manifest = self._require_manifest(conn, run_id, step)
            keys: list[str] = []
            for chunk in q.chunks(manifest.rollout_ids):
                query = select(SampleRow.key).where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
                keys.extend(conn.execute(query).scalars())
            return q.mark_trained(conn, run_id, keys, step)

        return self._write(work)

    # ---- rescores ---------------------------------------------------------------------------

    def write_rescores(self, run_id: str, scorer: str, rewards: Mapping[str, float | dict[str, Any]]) -> int:
        """Store `rewards` (by sample key) as `scorer`'s, beside the samples' own rewards; keys
        `scorer` already scored keep their first reward. Returns how many were new."""
        return self._write(lambda conn: rescores.write(conn, run_id, scorer, rewards))

    def read_sample_page(self, run_id: str, after_id: int = 0, limit: int = 256) -> list[tuple[int, str, Sample]]:
        """The run's samples in write order, `limit` at a time: (row id, key, sample) after row
        `after_id` (pass the last row id of the previous page)."""
        return self._read(lambda conn: rescores.page(conn, run_id, after_id, limit))

    def rescore_summary(self, run_id: str, scorer: str) -> tuple[int, list[rescores.RescoreStep]]:
        """How many samples `scorer` scored, and each trained step's old and new mean reward."""
        return self._read(lambda conn: (rescores.scored_keys(conn, run_id, scorer),
                                        rescores.summary(conn, run_id, scorer)))

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
        run_id = q.check_run_id(run_id)
        rollout_id = check_rollout_id(rollout_id)
        row = turn_row(run_id, rollout_id, turn, token_ids, loss_mask, log_probs, meta)
        row["created_at"] = utcnow()
        self._require_run(run_id)

        def work(conn: Connection) -> bool:
            last = q.last_turn(conn, run_id, rollout_id)
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

        return self._write(work)  # the same turn appended concurrently: the retry finds it stored

    def read_turns(self, run_id: str, rollout_id: str | int, *, start: int = 0) -> list[Turn]:
        """Stored turns of a rollout from `start` on, in order; `[]` when none are stored."""
        rollout_id = check_rollout_id(rollout_id)
        query = (
            select(*(c.label(name) for name, c in TURN_COLUMNS.items()))
            .where(TurnRow.run_id == run_id, TurnRow.rollout_id == rollout_id, TurnRow.turn >= start)
            .order_by(TurnRow.turn)
        )
        rows = self._read(lambda conn: conn.execute(query).mappings().all())
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
        return self._read(lambda conn: q.last_turn(conn, run_id, rollout_id))

    # ---- internals ------------------------------------------------------------------------

    def _live(self) -> Engine:
        if self._closed:
            raise StoreError(f"store {self.url!r} is closed; open it again with SampleStore.open")
        return self._engine

    def _write(self, work: Callable[[Connection], T]) -> T:
        """`work(conn)` in one write transaction, retried while SQLite is locked (`run_write`).

        Run again, too, when a concurrent writer inserted the same unique key first: the retry
        sees the other writer's committed rows and so stores nothing twice.
        """
        for tries_left in reversed(range(_WRITE_ATTEMPTS)):
            try:
                return run_write(self._live(), work, lock_wait_s=self._lock_wait_s)
            except IntegrityError:
                if not tries_left:
                    raise
        raise AssertionError("unreachable")

    def _read(self, work: Callable[[Connection], T]) -> T:
        """`work(conn)` in one read transaction (one snapshot), retried while SQLite is locked."""
        return run_read(self._live(), work, lock_wait_s=self._lock_wait_s)

    def _require_manifest(self, conn: Connection, run_id: str, step: int) -> StepManifest:
        manifest = q.read_manifest(conn, run_id, step)
        if manifest is None:
            raise MissingManifestError(
                f"run {run_id!r} has no manifest for step {step} in store {self.url!r}; a step's rollouts are "
                f"recorded with write_step_manifest({run_id!r}, {step}, rollout_ids) before it trains"
            )
        return manifest

    def _require_run(self, run_id: str) -> None:
        if run_id in self._known_runs:
            return
        exists = self._read(lambda conn: conn.execute(select(RunRow.run_id).where(RunRow.run_id == run_id)).first())
        if exists is None:
            raise StoreError(
                f"run {run_id!r} is not in store {self.url!r}; create it first with store.ensure_run({run_id!r})"
            )
        self._known_runs.add(run_id)
