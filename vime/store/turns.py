"""Trajectory turns of agent rollouts: appended in order without gaps, each once."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, insert, select

from vime.store import codec
from vime.store import queries as q
from vime.store.base import StoreBase
from vime.store.errors import StoreError
from vime.store.models import TurnRow, utcnow
from vime.store.queries import Turn
from vime.store.rows import TURN_COLUMNS, check_rollout_id, turn_row


class TurnsApi(StoreBase):
    """Turns of agent rollouts."""

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
