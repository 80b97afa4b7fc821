"""Alembic environment for the sample store.

`vime.store.migrate` passes an open connection in `config.attributes["connection"]` (inside a
transaction it owns); `alembic` used by hand passes `sqlalchemy.url` instead.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import make_url

from vime.store.database import make_engine, write_transaction
from vime.store.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    context.configure(url=config.get_main_option("sqlalchemy.url"), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()
elif config.attributes.get("connection") is not None:
    _run(config.attributes["connection"])
else:
    engine = make_engine(make_url(config.get_main_option("sqlalchemy.url")))
    try:
        with write_transaction(engine) as connection:
            _run(connection)
    finally:
        engine.dispose()
