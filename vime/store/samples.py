"""Samples: rollouts written once, read by key, rollout or filter, marked trained once; and
rescores, another scorer's rewards stored beside the samples' own."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, func, insert, select

from vime.errors import ConfigError
from vime.store import queries as q
from vime.store import rescores
from vime.store.base import StoreBase
from vime.store.errors import MissingSampleError
from vime.store.models import SampleRow, utcnow
from vime.store.queries import StatusFilter
from vime.store.rows import check_rollout_id, row_to_ref, row_to_sample, sample_row
from vime.types import Sample, SampleError, SampleRef


class SamplesApi(StoreBase):
    """Rollouts' samples and their rescores."""

    def write_rollout(self, run_id: str, rollout_id: str | int, samples: Sequence[Sample]) -> list[SampleRef]:
        """Store the siblings of one rollout under keys `f"{rollout_id}/{i}"`, once; return their refs."""
        rollout_id = check_rollout_id(rollout_id)
        return self.write_rollouts(run_id, {rollout_id: samples})[rollout_id]

    def write_rollouts(
        self, run_id: str, rollouts: Mapping[str | int, Sequence[Sample]], *, eval_step: int | None = None
    ) -> dict[str, list[SampleRef]]:
        """Store many rollouts in one transaction (one bulk insert); return refs per rollout id.

        Rollouts already stored are left as they are and their stored refs returned. Every
        sample is validated and encoded first: one bad sample and nothing is written. With
        `eval_step` the samples are eval samples of the round at that step: never trained.
        """
        run_id = q.check_run_id(run_id)
        if eval_step is not None:
            q.check_step("write_rollouts eval_step", eval_step)
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
                row["eval_step"] = eval_step
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
        evaluation: bool | None = False,
        eval_step: int | None = None,
    ) -> Iterator[tuple[SampleRef, Sample]]:
        """Yield (ref, sample) in write order, filtered by status, not-yet-trained, or rollout.
        Training samples only by default; `evaluation=True` the eval samples (of the round at
        `eval_step`, when given), `evaluation=None` both.

        Reads `batch_size` rows per short transaction, so a long iteration holds no database
        snapshot open; samples written meanwhile may or may not appear.
        """
        if batch_size < 1:
            raise ConfigError(f"iter_samples: batch_size {batch_size!r} must be at least 1")
        where = q.filters(run_id, status, untrained, rollout_id, evaluation, eval_step)
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
        evaluation: bool | None = False,
        eval_step: int | None = None,
    ) -> int:
        """How many samples of the run match the filters (same filters as `iter_samples`)."""
        query = select(func.count()).select_from(SampleRow).where(
            *q.filters(run_id, status, untrained, rollout_id, evaluation, eval_step))
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
