"""The SQL behind `SampleStore.write_rescores` / `rescore_summary`: rewards from other reward
code, kept beside each sample's own reward (`RescoreRow`), never overwriting anything."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, func, insert, select

from vime.store.models import RescoreRow, SampleRow
from vime.store.queries import chunks, select_samples
from vime.store.rows import check_json, row_to_sample
from vime.types import Sample


@dataclass(frozen=True)
class RescoreStep:
    """One train step under the original and the new reward code (numeric rewards only)."""

    step: int
    samples: int
    old_mean: float | None
    new_mean: float | None


def write(conn: Connection, run_id: str, scorer: str, rewards: Mapping[str, float | dict[str, Any]]) -> int:
    """Insert the rewards of keys `scorer` has not scored yet; how many were new."""
    done: set[str] = set()
    for chunk in chunks(list(rewards)):
        done.update(conn.execute(select(RescoreRow.key).where(
            RescoreRow.run_id == run_id, RescoreRow.scorer == scorer, RescoreRow.key.in_(chunk))).scalars())
    rows = [{"run_id": run_id, "scorer": scorer, "key": key,
             "reward": value if not isinstance(value, dict) else None,
             "reward_json": check_json("rescore reward", value) if isinstance(value, dict) else None}
            for key, value in rewards.items() if key not in done]
    if rows:
        conn.execute(insert(RescoreRow.__table__), rows)
    return len(rows)


def scored_keys(conn: Connection, run_id: str, scorer: str) -> int:
    return int(conn.execute(select(func.count()).select_from(RescoreRow).where(
        RescoreRow.run_id == run_id, RescoreRow.scorer == scorer)).scalar_one())


def summary(conn: Connection, run_id: str, scorer: str) -> list[RescoreStep]:
    joined = (select(SampleRow.trained_step, func.count(), func.avg(SampleRow.reward), func.avg(RescoreRow.reward))
              .join(RescoreRow, (RescoreRow.run_id == SampleRow.run_id) & (RescoreRow.key == SampleRow.key)
                    & (RescoreRow.scorer == scorer))
              .where(SampleRow.run_id == run_id, SampleRow.trained_step.is_not(None))
              .group_by(SampleRow.trained_step).order_by(SampleRow.trained_step))
    return [RescoreStep(step, n, None if old is None else float(old), None if new is None else float(new))
            for step, n, old, new in conn.execute(joined).all()]


def page(conn: Connection, run_id: str, after_id: int, limit: int) -> list[tuple[int, str, Sample]]:
    """Up to `limit` samples of the run stored after row `after_id`: (row id, key, sample)."""
    query = (select_samples(SampleRow.id.label("row_id")).where(SampleRow.run_id == run_id, SampleRow.id > after_id)
             .order_by(SampleRow.id).limit(limit))
    return [(row["row_id"], row["key"], row_to_sample(row)) for row in conn.execute(query).mappings().all()]
