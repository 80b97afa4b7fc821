"""`StoreBase`: a store's engine, its lifecycle (open, close) and its transactions.

The API (`SampleStore`, in `vime.store.store`) is built from one mixin per job on top of it:
`runs`, `samples` (with rescores), `steps` (manifests) and `turns`. Every write goes through
`_write` (retried while SQLite is locked, and once more when a concurrent writer inserted the
same unique key first), every read through `_read` (one snapshot).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Self, TypeVar

from sqlalchemy import Connection, Engine, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from vime.errors import ConfigError
from vime.store import queries as q
from vime.store.database import (
    DEFAULT_BUSY_TIMEOUT_S,
    DEFAULT_LOCK_WAIT_S,
    make_engine,
    resolve_url,
    run_read,
    run_write,
    shown,
)
from vime.store.errors import StoreError
from vime.store.migrate import upgrade_to_head
from vime.store.models import RunRow

_WRITE_ATTEMPTS = 3

T = TypeVar("T")


class StoreBase:
    """An open store: its engine, the runs known to exist, and transactions on it."""

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
    ) -> Self:
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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r}{', closed' if self._closed else ''})"

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

    def _require_run(self, run_id: str) -> None:
        if run_id in self._known_runs:
            return
        exists = self._read(lambda conn: conn.execute(select(RunRow.run_id).where(RunRow.run_id == run_id)).first())
        if exists is None:
            raise StoreError(
                f"run {run_id!r} is not in store {self.url!r}; create it first with store.ensure_run({run_id!r})"
            )
        self._known_runs.add(run_id)
