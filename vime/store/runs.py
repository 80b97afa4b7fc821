"""Runs: created once with their config, re-registered with the flags of each (re)start; their
newest checkpoint and, once finished, the state they ended with (what a later start reads)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert, select, update

from vime.store import queries as q
from vime.store.base import StoreBase
from vime.store.models import RunRow, utcnow
from vime.store.rows import check_json


@dataclass(frozen=True)
class RunProgress:
    """What the store holds of a run's progress besides its samples and step manifests."""

    checkpoint: dict[str, Any] | None  # the newest checkpoint: step, path, weight_version, data_position
    finished: dict[str, Any] | None  # the state the run finished with; None while it has not


class RunsApi(StoreBase):
    """Runs and their stored config and flags."""

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

        Workers that serve many runs build a run's config from the flags (`vime.config.run_args`); a run
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
                kept = {k: v for k, v in (stored.config or {}).items() if k != "ended"}
                conn.execute(update(RunRow).where(RunRow.run_id == run_id).values(config={**kept, **fields}))

        self._write(work)
        self._known_runs.add(run_id)

    def record_ended(self, run_id: str, state: str, line: str) -> None:
        """Record that run `run_id`'s workflow ended without finishing (`state`: "failed" or
        "cancelled"; `line`: what the launcher printed), so `vime runs` can say so once the
        Temporal that knew it is gone. A start of the run clears it (`register_run`)."""
        run_id = q.check_run_id(run_id)
        ended = {"state": state, "line": line[:500], "at": utcnow().isoformat()}

        def work(conn: Connection) -> None:
            stored = conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first()
            if stored is not None:
                conn.execute(update(RunRow).where(RunRow.run_id == run_id).values(
                    config={**(stored.config or {}), "ended": ended}))

        self._write(work)

    def run_argv(self, run_id: str) -> list[str] | None:
        """The flags run `run_id` was last started with (None: no such run, or one never registered)."""
        row = self._read(lambda conn: conn.execute(select(RunRow.config).where(RunRow.run_id == run_id)).first())
        return None if row is None or not isinstance(row.config, dict) else row.config.get("argv")

    def record_checkpoint(self, run_id: str, step: int, path: str, *, weight_version: int,
                          data_position: int) -> None:
        """Record that run `run_id` saved a checkpoint at `step` (kept when it is the newest: a
        retried save, or an older step saved again, changes nothing)."""
        q.check_step("record_checkpoint", step)
        self._require_run(run_id)
        record = {"step": step, "path": str(path), "weight_version": weight_version, "data_position": data_position}

        def work(conn: Connection) -> None:
            stored = conn.execute(select(RunRow.checkpoint).where(RunRow.run_id == run_id)).scalar_one()
            if stored is None or stored.get("step", -1) < step:
                conn.execute(update(RunRow).where(RunRow.run_id == run_id).values(checkpoint=record))

        self._write(work)

    def record_finished(self, run_id: str, state: Mapping[str, Any]) -> None:
        """Record that run `run_id` finished, with the state it ended with (step, weight_version,
        data_position, checkpoint...). The first record stays: a run finishes once."""
        self._require_run(run_id)
        finished = check_json("finished state", dict(state))

        def work(conn: Connection) -> None:
            conn.execute(update(RunRow).where(RunRow.run_id == run_id, RunRow.finished.is_(None))
                         .values(finished=finished))

        self._write(work)

    def run_progress(self, run_id: str) -> RunProgress:
        """The run's newest recorded checkpoint and finished state (both None for an unknown run)."""
        row = self._read(lambda conn: conn.execute(
            select(RunRow.checkpoint, RunRow.finished).where(RunRow.run_id == run_id)).first())
        return RunProgress(None, None) if row is None else RunProgress(row.checkpoint, row.finished)
