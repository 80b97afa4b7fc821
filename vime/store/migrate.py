"""Bring a store's schema to the newest migration: `upgrade_to_head(engine)` on every open.

Migrations ship inside the package (`vime/store/migrations/`) and run programmatically, with
no alembic.ini on disk. For hand use: `alembic_config(url=...)` gives a `Config` that
`alembic.command` functions accept (`command.current`, `command.history`, ...).

Invariant: after `upgrade_to_head` returns, the database is at `head_revision()`. It is
idempotent, and safe when several processes open a fresh database at once: on SQLite the
upgrade runs in one `BEGIN IMMEDIATE` transaction (the second process waits, then finds the
schema at head); on Postgres it takes a transaction-scoped advisory lock; on anything else a
failed concurrent upgrade is accepted when the database ends up at head. A database at an
older revision (a run directory from an earlier vime) is upgraded the same way, keeping its
data; while it is locked by another process the upgrade waits (`run_write`).

Opening a store at head imports no alembic (a third of `vime show`'s start-up CPU): the head is
read from the migration files' `revision`/`down_revision` lines (`shipped_head`, which a test
holds equal to alembic's) and the database's revision from its `alembic_version` table; alembic
is imported only to upgrade.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.exc import DBAPIError

from vime.errors import ConfigError
from vime.store.database import DEFAULT_LOCK_WAIT_S, run_read, run_write, shown

if TYPE_CHECKING:
    from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
_PG_LOCK_ID = 0x76696D65  # "vime"
_REVISION_LINE = re.compile(r"^(down_revision|revision)\s*(?::[^=]*)?=\s*(.+)$", re.MULTILINE)


def alembic_config(connection: Connection | None = None, *, url: str | None = None) -> Config:
    """An Alembic `Config` for vime's migrations, bound to an open `connection` or to `url`."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR).replace("%", "%%"))
    if url is not None:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    config.attributes["connection"] = connection
    return config


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    assert head is not None, f"no migrations found in {MIGRATIONS_DIR}"
    return head


@cache
def shipped_head() -> str | None:
    """The head of the migrations shipped, from their files' `revision = "..."` and
    `down_revision = ...` lines without importing alembic: the one revision no other revises;
    None when the files do not say it plainly (branches, merges), and `head_revision` decides."""
    revisions, revised = set(), set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        found = dict(_REVISION_LINE.findall(path.read_text()))
        if "revision" not in found:
            return None
        revisions.add(found["revision"].strip().strip("'\""))
        revised.add(found.get("down_revision", "None").strip().strip("'\""))
    heads = revisions - revised
    return heads.pop() if len(heads) == 1 else None


def current_revision(connection: Connection) -> str | None:
    """The revision the database is at; None for a database vime has never opened."""
    from alembic.runtime.migration import MigrationContext

    return MigrationContext.configure(connection).get_current_revision()


def _stored_revision(connection: Connection) -> str | None:
    """`current_revision` by plain SQL: alembic's one-row `alembic_version` table."""
    if not inspect(connection).has_table("alembic_version"):
        return None
    rows = connection.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    return rows[0] if len(rows) == 1 else None


def upgrade_to_head(engine: Engine, *, lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> None:
    shipped = shipped_head()
    if shipped is not None and run_read(engine, _stored_revision, lock_wait_s=lock_wait_s) == shipped:
        return  # at head: no alembic import
    from alembic import command
    from alembic.util import CommandError

    head = head_revision()
    if _revision(engine, lock_wait_s) == head:
        return

    def upgrade(connection: Connection) -> None:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_ID})")
        command.upgrade(alembic_config(connection), "head")

    try:
        run_write(engine, upgrade, lock_wait_s=lock_wait_s)
    except CommandError as exc:
        raise ConfigError(
            f"store {shown(engine.url)!r} cannot be migrated ({exc}); if another (newer) vime "
            f"created it, upgrade vime, or open a fresh run directory"
        ) from None
    except DBAPIError:
        if _revision(engine, lock_wait_s) != head:
            raise


def _revision(engine: Engine, lock_wait_s: float) -> str | None:
    return run_read(engine, current_revision, lock_wait_s=lock_wait_s)
