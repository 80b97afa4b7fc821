"""Where the store lives: resolving a run directory or URL to an engine, and write transactions.

A run directory means the embedded default, `sqlite:///<run_dir>/vime.db`; any SQLAlchemy URL
(e.g. `postgresql+psycopg://user@host/vime`) means that database instead. Same code either way.

SQLite is made safe for several processes (rollout workers, the trainer) writing one file:
every connection gets WAL journaling (readers never block the writer), a busy timeout
(a writer waits for the lock instead of failing), and foreign keys on. Write transactions
start with `BEGIN IMMEDIATE`, so a transaction that reads then writes takes the write lock
up front and cannot fail half-way with "database is locked" when another process committed
in between. WAL needs a local filesystem (not NFS); use Postgres across machines.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, NoSuchModuleError
from sqlalchemy.pool import StaticPool

from vime.errors import ConfigError

DB_FILENAME = "vime.db"
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


def make_engine(url: URL, *, busy_timeout_s: float = 30.0) -> Engine:
    """Create the engine for `url`, raising `ConfigError` (naming the URL) when it cannot be used."""
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
            kwargs.update(connect_args={"timeout": busy_timeout_s})
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

    Commits when the block ends, rolls back if it raises.
    """
    with engine.connect() as connection:
        connection.execution_options(sqlite_begin="IMMEDIATE")
        with connection.begin():
            yield connection
