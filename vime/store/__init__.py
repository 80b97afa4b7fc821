"""The sample store: claim check for Temporal (token data here, ids in workflows).

`SampleStore.open(run_dir_or_url)` gives a store on SQLite (`<run_dir>/vime.db`) or any
SQLAlchemy URL, migrated to the current schema. Modules: `models` (tables), `codec` (binary
per-token columns), `rows` (Sample <-> columns), `engine` (URL, SQLite settings, write
transactions), `migrate` (Alembic upgrade on open), `store` (the API).
"""

from vime.store.errors import AlreadyTrainedError, MissingSampleError, StoreError
from vime.store.store import SampleStore, Turn

__all__ = ["AlreadyTrainedError", "MissingSampleError", "SampleStore", "StoreError", "Turn"]
