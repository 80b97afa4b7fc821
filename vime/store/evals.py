"""Eval rounds: each round's figures recorded once, beside its eval samples (`eval_step`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select

from vime.errors import ConfigError
from vime.store import queries as q
from vime.store.base import StoreBase
from vime.store.models import EvalRoundRow, utcnow
from vime.store.rows import check_json


@dataclass(frozen=True)
class EvalRound:
    """One recorded eval round: after `step` training steps, policy `weight_version`, its figures."""

    run_id: str
    step: int
    weight_version: int
    metrics: dict[str, Any]


def _read(conn: Connection, run_id: str, step: int | None = None) -> list[EvalRound]:
    query = select(EvalRoundRow.step, EvalRoundRow.weight_version, EvalRoundRow.metrics).where(
        EvalRoundRow.run_id == run_id)
    if step is not None:
        query = query.where(EvalRoundRow.step == step)
    return [EvalRound(run_id, int(r.step), int(r.weight_version), dict(r.metrics or {}))
            for r in conn.execute(query.order_by(EvalRoundRow.step))]


class EvalsApi(StoreBase):
    """Eval rounds' figures (the eval samples themselves are samples with an `eval_step`)."""

    def write_eval_round(self, run_id: str, step: int, weight_version: int,
                         metrics: Mapping[str, Any]) -> EvalRound:
        """Record the figures of the eval round at `step`, once: when the round is recorded
        already (a retried activity, a restarted run), the recorded one is returned unchanged."""
        run_id = q.check_run_id(run_id)
        q.check_step("write_eval_round", step)
        if isinstance(weight_version, bool) or not isinstance(weight_version, int) or weight_version < 0:
            raise ConfigError(f"write_eval_round: weight_version {weight_version!r} must be an int >= 0")
        metrics_json = check_json("eval round metrics", dict(metrics))
        self._require_run(run_id)

        def work(conn: Connection) -> EvalRound:
            stored = _read(conn, run_id, step)
            if stored:
                return stored[0]
            conn.execute(insert(EvalRoundRow.__table__), {"run_id": run_id, "step": step,
                                                          "weight_version": weight_version,
                                                          "metrics": metrics_json, "created_at": utcnow()})
            return _read(conn, run_id, step)[0]

        return self._write(work)

    def read_eval_round(self, run_id: str, step: int) -> EvalRound | None:
        """The eval round recorded at `step`, None when there is none (yet)."""
        q.check_step("read_eval_round", step)
        found = self._read(lambda conn: _read(conn, run_id, step))
        return found[0] if found else None

    def eval_rounds(self, run_id: str) -> list[EvalRound]:
        """Every recorded eval round of the run, by step."""
        return self._read(lambda conn: _read(conn, run_id))
