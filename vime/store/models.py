"""Tables of the sample store: runs, samples, trajectory turns, step manifests, rescores, eval rounds.

The schema is owned by the Alembic migrations in `vime/store/migrations/versions/`; these
models must describe exactly what the migrations build (tests/test_store.py compares them).
Change both together: edit a model, then add a migration.

Per-token data (token ids, loss mask, log-probs) is binary, packed by `vime.store.codec`;
everything small and human-readable (prompt, label, metadata) is JSON.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Lengths bound what Postgres stores in VARCHAR columns; SQLite ignores them. The store API
# checks ids against them so an overlong id fails with a message, not a driver error.
RUN_ID_LENGTH = 255
ROLLOUT_ID_LENGTH = 255
KEY_LENGTH = 300

# SQLite only auto-increments an `INTEGER PRIMARY KEY`; elsewhere ids are 64-bit.
RowId = BigInteger().with_variant(Integer(), "sqlite")

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class RunRow(Base):
    """One training run; every sample and turn belongs to one. `config` is kept as first given;
    `checkpoint` is the newest checkpoint saved, `finished` the state the run ended with (NULL
    until it finished): what a later start of the run resumes from or refuses on."""

    __tablename__ = "runs"

    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    config: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    checkpoint: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    finished: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)


class SampleRow(Base):
    """One stored `Sample`, the `sibling`-th of its rollout; `key` is `f"{rollout_id}/{sibling}"`.

    Invariants: (run_id, key) is unique; a rollout's siblings are written in one transaction,
    so either all of them are stored or none; `trained_step` is set once, by the train step
    that consumed the sample, and never changed afterwards.
    """

    __tablename__ = "samples"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), ForeignKey("runs.run_id"))
    key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    rollout_id: Mapped[str] = mapped_column(String(ROLLOUT_ID_LENGTH))
    sibling: Mapped[int] = mapped_column(Integer)
    group_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    index: Mapped[int | None] = mapped_column("index", Integer, nullable=True)
    status: Mapped[str] = mapped_column(String(16))
    # A numeric reward lives in `reward` (so SQL can filter and average it); a dict reward
    # (several named scores) lives in `reward_json` and leaves `reward` NULL.
    reward: Mapped[float | None] = mapped_column(Double, nullable=True)
    reward_json: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    response_length: Mapped[int] = mapped_column(Integer)
    prompt: Mapped[Any] = mapped_column(JSON)
    response: Mapped[str] = mapped_column(Text)
    label: Mapped[Any] = mapped_column(JSON, nullable=True)
    sample_metadata: Mapped[dict[str, Any]] = mapped_column("metadata", JSON)
    train_metadata: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    weight_versions: Mapped[list[Any]] = mapped_column(JSON)
    session_id: Mapped[str | None] = mapped_column(String(255), nullable=True)
    remove_sample: Mapped[bool] = mapped_column(Boolean)
    trained_step: Mapped[int | None] = mapped_column(Integer, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    tokens: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    rollout_log_probs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    teacher_log_probs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    # The step of the eval round the sample was generated for; NULL: a training sample. An eval
    # sample is never trained (`mark_trained` refuses it) and never in a step manifest.
    eval_step: Mapped[int | None] = mapped_column(Integer, nullable=True)

    __table_args__ = (
        UniqueConstraint("run_id", "key"),
        Index(None, "run_id", "rollout_id", "sibling"),
        Index(None, "run_id", "status"),
        Index(None, "run_id", "trained_step"),
        Index(None, "run_id", "eval_step"),
    )


class TurnRow(Base):
    """One turn of an agent rollout, stored as it finishes so a retried rollout resumes after it.

    Invariants: (run_id, rollout_id, turn) is unique and a rollout's turns are 0, 1, 2, ...
    without gaps; `token_ids`, `loss_mask` and `log_probs` (when set) have equal lengths.
    `meta` is small JSON: finish reason, weight version, segment break reason.
    """

    __tablename__ = "trajectory_turns"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), ForeignKey("runs.run_id"))
    rollout_id: Mapped[str] = mapped_column(String(ROLLOUT_ID_LENGTH))
    turn: Mapped[int] = mapped_column(Integer)
    token_ids: Mapped[bytes] = mapped_column(LargeBinary)
    loss_mask: Mapped[bytes] = mapped_column(LargeBinary)
    log_probs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "rollout_id", "turn"),)


class StepManifestRow(Base):
    """What train step `step` of a run trains on: its rollouts, in order, recorded once.

    The training workflow passes only (run_id, step); the trainer reads the step's samples
    through this row. Invariants: (run_id, step) is unique; a row is never changed once
    written (the first write wins), so a retried or replayed step trains on the same samples;
    every id in `rollout_ids` named a rollout stored for the run when the row was written.
    `rollout_ids` is a JSON list of str; `weight_version` is the policy version the rollouts
    were started under; `meta` is small JSON (groups, samples, filter counts).
    """

    __tablename__ = "step_manifests"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), ForeignKey("runs.run_id"))
    step: Mapped[int] = mapped_column(Integer)
    rollout_ids: Mapped[list[str]] = mapped_column(JSON)
    weight_version: Mapped[int] = mapped_column(Integer)
    meta: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "step"),)


class RescoreRow(Base):
    """A sample's reward under other reward code (`vime rescore`), beside its own `reward`.

    `scorer` names the reward code (a hash of its source). Invariants: (run_id, scorer, key) is
    unique and a row is never changed once written, so rescoring again with the same code writes
    nothing; the sample row itself is never touched.
    """

    __tablename__ = "rescores"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), ForeignKey("runs.run_id"))
    scorer: Mapped[str] = mapped_column(String(64))
    key: Mapped[str] = mapped_column(String(KEY_LENGTH))
    reward: Mapped[float | None] = mapped_column(Double, nullable=True)
    reward_json: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "scorer", "key"),)


class EvalRoundRow(Base):
    """The figures of one eval round (`step`: evaluated after `step` training steps, with policy
    `weight_version`), recorded once: (run_id, step) is unique and the first write wins, so a
    retried or replayed round reports what was recorded. `metrics` is flat JSON keyed
    `eval/<set>/<figure>` (`vime.rollout.eval_metrics`)."""

    __tablename__ = "eval_rounds"

    id: Mapped[int] = mapped_column(RowId, primary_key=True, autoincrement=True)
    run_id: Mapped[str] = mapped_column(String(RUN_ID_LENGTH), ForeignKey("runs.run_id"))
    step: Mapped[int] = mapped_column(Integer)
    weight_version: Mapped[int] = mapped_column(Integer)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)

    __table_args__ = (UniqueConstraint("run_id", "step"),)
