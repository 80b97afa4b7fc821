"""The sample store: claim check for Temporal (token data here, ids in workflows).

`SampleStore.open(run_dir_or_url)` gives a store on SQLite (`<run_dir>/vime.db`) or any
SQLAlchemy URL, migrated to the current schema. Modules: `models` (tables), `codec` (binary
per-token columns), `rows` (Sample <-> columns), `engine` (URL, SQLite settings, write
transactions, waiting out a locked database), `migrate` (Alembic upgrade on open), `store`
(the API, `SampleStore`), built from one mixin per job over `base` (open, close, transactions):
`runs`, `samples` (with rescores), `steps` (step manifests), `turns` and `evals` (eval rounds). Async activities call
it off their event loop with `vime.temporal.store_calls.store_call`.
"""

from vime.store.errors import (
    AlreadyTrainedError,
    MissingManifestError,
    MissingSampleError,
    StoreError,
    StoreLockedError,
)
from vime.store.store import EvalRound, SampleStore, StepManifest, Turn

__all__ = [
    "AlreadyTrainedError",
    "EvalRound",
    "MissingManifestError",
    "MissingSampleError",
    "SampleStore",
    "StepManifest",
    "StoreError",
    "StoreLockedError",
    "Turn",
]
