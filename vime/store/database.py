"""Where the store lives: resolving a run directory or URL to an engine, and write transactions.

A run directory means the embedded default, `sqlite:///<run_dir>/vime.db`; any SQLAlchemy URL
(e.g. `postgresql+psycopg://user@host/vime`) means that database instead. Same code either way.

SQLite is made safe for several processes (rollout workers, the trainer) writing one file:
every connection gets WAL journaling (readers never block the writer), a busy timeout
(a writer waits for the lock instead of failing), and foreign keys on. Write transactions
start with `BEGIN IMMEDIATE`, so a transaction that reads then writes takes the write lock
up front and cannot fail half-way with "database is locked" when another process committed
in between. WAL needs a local filesystem (not NFS); use Postgres across machines.

A locked SQLite store waits instead of failing: `run_write` / `run_read` run a transaction
again (with backoff) whenever SQLite reports the database busy or locked, until `lock_wait_s`
has passed since the first try. That covers a lock held longer than the busy timeout (a chaos
drill's `BEGIN EXCLUSIVE`, a long checkpoint) and the SQLITE_BUSY errors SQLite returns
without calling its busy handler (a deferred transaction upgrading to a write lock after
another process committed: SQLITE_BUSY_SNAPSHOT, a deadlock-avoiding SQLITE_BUSY). Every
transaction the store runs is idempotent, so running one again is safe. Threads never wait for
a pooled SQLite connection (the pool has no overflow limit; a connection is a file handle), so
a reader is not starved by writers that hold connections while they wait for the lock.
Postgres keeps its own locking: no retries, no pool change.
"""

from __future__ import annotations

import os
import random
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError, OperationalError
from sqlalchemy.pool import StaticPool

from vime.errors import ConfigError
from vime.log import get_logger
from vime.store.errors import StoreLockedError

log = get_logger(__name__)

T = TypeVar("T")

DB_FILENAME = "vime.db"
# How long one SQLite statement waits for another connection's lock (SQLite's busy handler).
DEFAULT_BUSY_TIMEOUT_S = 300.0
# How long a transaction keeps being retried while SQLite reports the database locked.
DEFAULT_LOCK_WAIT_S = 600.0
_SQLITE_BUSY, _SQLITE_LOCKED = 5, 6
_BACKOFF_FIRST_S, _BACKOFF_MAX_S = 0.05, 2.0
_LOG_EVERY_S = 30.0
_EXAMPLES = "a run directory, sqlite:///<run_dir>/vime.db, or postgresql+psycopg://user:pass@host/vime"


def resolve_url(target: str | os.PathLike[str]) -> URL:
    """A URL as given, or `sqlite:///<abs run_dir>/vime.db` for a directory path."""
    text = os.fspath(target)
    if "://" in text:
        try:
            return make_url(text)
        except ArgumentError as exc:
            raise ConfigError(f"store URL {text!r} cannot be parsed ({exc}); pass {_EXAMPLES}") from None
    run_dir = Path(text).expanduser().resolve()
    if run_dir.is_file():
        raise ConfigError(
            f"store location {text!r} is a file; pass its run directory, or the URL sqlite:///{run_dir}"
        )
    return URL.create("sqlite", database=str(run_dir / DB_FILENAME))


def shown(url: URL) -> str:
    """The URL for messages and logs: never print a password."""
    return url.render_as_string(hide_password=True)


def make_engine(url: URL, *, busy_timeout_s: float = DEFAULT_BUSY_TIMEOUT_S) -> Engine:
    """Create the engine for `url`, raising `ConfigError` (naming the URL) when it cannot be used.

    `busy_timeout_s` is SQLite's busy timeout: how long one statement waits for another
    connection's lock before SQLite reports the database locked.
    """
    if isinstance(busy_timeout_s, bool) or not isinstance(busy_timeout_s, int | float) or not busy_timeout_s >= 0:
        raise ConfigError(f"store busy_timeout_s {busy_timeout_s!r} must be a number of seconds >= 0")
    kwargs: dict = {}
    sqlite = url.get_backend_name() == "sqlite"
    if sqlite:
        if _is_memory(url):
            kwargs.update(poolclass=StaticPool, connect_args={"check_same_thread": False})
        else:
            directory = Path(url.database).expanduser().parent
            try:
                directory.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise ConfigError(
                    f"store URL {shown(url)!r}: cannot create directory {str(directory)!r} ({exc.strerror}); "
                    f"pass a run directory you can write to"
                ) from None
            kwargs.update(connect_args={"timeout": busy_timeout_s}, max_overflow=-1)
    try:
        engine = create_engine(url, **kwargs)
    except NoSuchModuleError:
        raise ConfigError(
            f"store URL {shown(url)!r}: SQLAlchemy has no database dialect {url.drivername!r}; pass {_EXAMPLES}"
        ) from None
    except ImportError as exc:
        raise ConfigError(
            f"store URL {shown(url)!r} needs the database driver {exc.name or exc!s}, which is not installed; "
            f"pip install it, or name an installed driver in the URL (e.g. postgresql+psycopg://...)"
        ) from None
    except (ArgumentError, TypeError, ValueError) as exc:
        raise ConfigError(f"store URL {shown(url)!r} cannot be used ({exc}); pass {_EXAMPLES}") from None
    if sqlite:
        _configure_sqlite(engine, busy_timeout_ms=int(busy_timeout_s * 1000))
    return engine


def _is_memory(url: URL) -> bool:
    return url.database in (None, "", ":memory:") or "mode=memory" in str(url.query)


def _configure_sqlite(engine: Engine, *, busy_timeout_ms: int) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        # SQLAlchemy, not the sqlite3 module, emits BEGIN (see `_on_begin`).
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {busy_timeout_ms}")
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA synchronous = NORMAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        mode = connection.get_execution_options().get("sqlite_begin", "DEFERRED")
        connection.exec_driver_sql(f"BEGIN {mode}")


@contextmanager
def write_transaction(engine: Engine) -> Iterator[Connection]:
    """A transaction that will write: `BEGIN IMMEDIATE` on SQLite, a plain BEGIN elsewhere.

    Commits when the block ends, rolls back if it raises. Not retried: use `run_write` for that.
    """
    with engine.connect() as connection:
        connection.execution_options(sqlite_begin="IMMEDIATE")
        with connection.begin():
            yield connection


def run_write(engine: Engine, work: Callable[[Connection], T], *, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> T:
    """`work(connection)` in a `write_transaction`, run again while SQLite reports the database locked.

    `work` must be safe to run again from the start (the store's writes are idempotent); what
    it did in a failed try was rolled back.
    """

    def attempt() -> T:
        with write_transaction(engine) as connection:
            return work(connection)

    return retry_when_locked(engine, attempt, lock_wait_s=lock_wait_s)


def run_read(engine: Engine, work: Callable[[Connection], T], *, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> T:
    """`work(connection)` on a connection of its own (one snapshot on SQLite), retried like `run_write`.

    In WAL mode a read waits for no writer; it can still meet a busy database in rare moments
    (a connection recovering the WAL after a crash), which the retry covers.
    """

    def attempt() -> T:
        with engine.connect() as connection, connection.begin():
            return work(connection)

    return retry_when_locked(engine, attempt, lock_wait_s=lock_wait_s)


def retry_when_locked(engine: Engine, attempt: Callable[[], T], *, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> T:
    """`attempt()`, tried again with backoff while it fails because SQLite is busy or locked.

    Stops retrying once `lock_wait_s` has passed since the first try and raises
    `StoreLockedError` (naming the store and what to do). Other errors, and every error on
    databases other than SQLite, propagate at once.
    """
    if engine.dialect.name != "sqlite":
        return attempt()
    began = time.monotonic()
    delay = _BACKOFF_FIRST_S
    tries = 0
    logged_at = began
    while True:
        tries += 1
        try:
            return attempt()
        except OperationalError as exc:
            if not is_lock_error(exc):
                raise
            now = time.monotonic()
            waited = now - began
            if waited >= lock_wait_s:
                raise StoreLockedError(
                    f"store {shown(engine.url)!r} stayed locked for {waited:.0f} s ({exc.orig}; {tries} tries): "
                    f"another process holds its write lock (find it with: fuser {engine.url.database}); end that "
                    f"transaction, or pass a longer lock_wait_s / busy_timeout_s to SampleStore.open"
                ) from exc
            if now - logged_at >= _LOG_EVERY_S or tries == 1:
                logged_at = now
                log.warning(
                    "store locked, waiting", store=shown(engine.url), waited_s=round(waited, 1), error=str(exc.orig)
                )
            time.sleep(min(delay * random.uniform(0.5, 1.0), lock_wait_s - waited))
            delay = min(delay * 2, _BACKOFF_MAX_S)


def is_lock_error(exc: BaseException) -> bool:
    """True for SQLite's "database is locked" family (SQLITE_BUSY*, SQLITE_LOCKED*): worth a retry."""
    orig = getattr(exc, "orig", exc)
    if not isinstance(orig, sqlite3.OperationalError):
        return False
    code = getattr(orig, "sqlite_errorcode", None)
    if code is not None:
        return code & 0xFF in (_SQLITE_BUSY, _SQLITE_LOCKED)
    message = str(orig).lower()
    return "locked" in message or "busy" in message
