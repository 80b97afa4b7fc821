"""Initial schema: runs, samples, trajectory_turns.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("config", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_runs")),
    )
    op.create_table(
        "samples",
        sa.Column("id", _row_id, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("rollout_id", sa.String(255), nullable=False),
        sa.Column("sibling", sa.Integer(), nullable=False),
        sa.Column("group_index", sa.Integer(), nullable=True),
        sa.Column("index", sa.Integer(), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("reward_json", sa.JSON(), nullable=True),
        sa.Column("response_length", sa.Integer(), nullable=False),
        sa.Column("prompt", sa.JSON(), nullable=False),
        sa.Column("response", sa.Text(), nullable=False),
        sa.Column("label", sa.JSON(), nullable=True),
        sa.Column("metadata", sa.JSON(), nullable=False),
        sa.Column("train_metadata", sa.JSON(), nullable=True),
        sa.Column("weight_versions", sa.JSON(), nullable=False),
        sa.Column("session_id", sa.String(255), nullable=True),
        sa.Column("remove_sample", sa.Boolean(), nullable=False),
        sa.Column("trained_step", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("tokens", sa.LargeBinary(), nullable=False),
        sa.Column("loss_mask", sa.LargeBinary(), nullable=True),
        sa.Column("rollout_log_probs", sa.LargeBinary(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_samples_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_samples")),
        sa.UniqueConstraint("run_id", "key", name=op.f("uq_samples_run_id_key")),
    )
    op.create_index(op.f("ix_samples_run_id_rollout_id_sibling"), "samples", ["run_id", "rollout_id", "sibling"])
    op.create_index(op.f("ix_samples_run_id_status"), "samples", ["run_id", "status"])
    op.create_index(op.f("ix_samples_run_id_trained_step"), "samples", ["run_id", "trained_step"])
    op.create_table(
        "trajectory_turns",
        sa.Column("id", _row_id, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("rollout_id", sa.String(255), nullable=False),
        sa.Column("turn", sa.Integer(), nullable=False),
        sa.Column("token_ids", sa.LargeBinary(), nullable=False),
        sa.Column("loss_mask", sa.LargeBinary(), nullable=False),
        sa.Column("log_probs", sa.LargeBinary(), nullable=True),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_trajectory_turns_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trajectory_turns")),
        sa.UniqueConstraint("run_id", "rollout_id", "turn", name=op.f("uq_trajectory_turns_run_id_rollout_id_turn")),
    )


def downgrade() -> None:
    op.drop_table("trajectory_turns")
    op.drop_index(op.f("ix_samples_run_id_trained_step"), table_name="samples")
    op.drop_index(op.f("ix_samples_run_id_status"), table_name="samples")
    op.drop_index(op.f("ix_samples_run_id_rollout_id_sibling"), table_name="samples")
    op.drop_table("samples")
    op.drop_table("runs")
