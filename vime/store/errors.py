"""Errors the store raises on valid input it cannot honour (bad input raises `SampleError`/`ConfigError`)."""

from __future__ import annotations

from vime.errors import VimeError


class StoreError(VimeError):
    """A request the stored state contradicts: an unknown run, a missing sample, a turn gap."""


class MissingSampleError(StoreError, LookupError):
    """A key (or rollout) the store does not hold for that run."""


class AlreadyTrainedError(StoreError):
    """A sample already consumed at another train step: using it again would train it twice."""


class MissingManifestError(StoreError, LookupError):
    """A train step with no recorded manifest (`write_step_manifest` was not called for it)."""


class StoreLockedError(StoreError):
    """The database stayed locked (SQLite: another process holding its write lock) past the wait allowed."""
