"""`SampleStore`: the claim check for Temporal.

Workflows pass `SampleRef`s (ids and small summaries); token ids, loss masks and log-probs live
here. Every write is idempotent, because Temporal retries activities:

- `write_rollout(s)`: a rollout is stored once, all its siblings in one transaction; writing it
  again (a retry, or a concurrent duplicate) stores nothing and returns the refs of what is
  stored. The first write wins, even if a retry generated different samples.
- `mark_trained`: a sample is consumed by exactly one train step; repeating that step is a
  no-op, another step raises `AlreadyTrainedError`.
- `append_turn`: a turn is stored once; turns are 0, 1, 2, ... without gaps, so a retried
  agent rollout resumes at `last_turn() + 1`.
- `write_step_manifest`: a train step's content (its rollout ids, in order) is recorded once;
  the first write wins, so a retried or replayed step trains on the same samples, and the
  training workflow passes only (run_id, step) however large the batch.
- `write_eval_round`: an eval round's figures are recorded once (first write wins); its
  samples are written with `write_rollouts(..., eval_step=step)` and never trained.

Bad input (`SampleError`, a `ConfigError`) is rejected before any transaction starts. A run must
exist (`ensure_run`) before anything is written under it, so a mistyped run id fails loudly.
A locked SQLite store is waited out (see `vime.store.engine`): a write blocked by another
process's lock finishes once the lock is released, up to `lock_wait_s`.
One `SampleStore` per process; it is safe to share between threads. Its calls block: from
async code use `vime.temporal.store_calls.store_call`.
"""

from __future__ import annotations

from vime.store.evals import EvalRound, EvalsApi
from vime.store.queries import StepManifest, Turn
from vime.store.runs import RunsApi
from vime.store.samples import SamplesApi
from vime.store.steps import StepsApi
from vime.store.turns import TurnsApi

__all__ = ["EvalRound", "SampleStore", "StepManifest", "Turn"]


class SampleStore(RunsApi, SamplesApi, StepsApi, TurnsApi, EvalsApi):
    """Samples and trajectory turns of training runs, in SQLite (default) or any SQL database.

    One mixin per job (`runs`, `samples`, `steps`, `turns`, `evals`) over `StoreBase` (`base`: the
    engine, open/close, transactions)."""
