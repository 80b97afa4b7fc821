"""Step manifests: what each train step trains on (its rollout ids, in order), recorded once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, insert, select

from vime.errors import ConfigError
from vime.store import queries as q
from vime.store.base import StoreBase
from vime.store.errors import MissingManifestError, MissingSampleError
from vime.store.models import SampleRow, StepManifestRow, utcnow
from vime.store.queries import StepManifest
from vime.store.rows import check_json, check_rollout_id, row_to_sample
from vime.types import Sample


class StepsApi(StoreBase):
    """Step manifests and the samples they name."""

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
                    select(SampleRow.rollout_id, SampleRow.eval_step)
                    .where(SampleRow.run_id == run_id, SampleRow.rollout_id.in_(chunk))
                    .distinct()
                )
                for rid, eval_step in conn.execute(query):
                    if eval_step is not None:
                        raise ConfigError(f"write_step_manifest: rollout {rid!r} of run {run_id!r} is an eval rollout "
                                          f"(the eval round at step {eval_step}); eval samples are never trained")
                    present.add(rid)
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

    def _require_manifest(self, conn: Connection, run_id: str, step: int) -> StepManifest:
        manifest = q.read_manifest(conn, run_id, step)
        if manifest is None:
            raise MissingManifestError(
                f"run {run_id!r} has no manifest for step {step} in store {self.url!r}; a step's rollouts are "
                f"recorded with write_step_manifest({run_id!r}, {step}, rollout_ids) before it trains"
            )
        return manifest
