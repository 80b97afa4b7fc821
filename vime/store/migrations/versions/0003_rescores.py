"""Rescores: rewards from other reward code, stored beside the sample's own reward.

Revision ID: 0003
Revises: 0002

Adds one table and touches no existing one: a store at 0002 is upgraded in place on its next
open. A sample's `reward` column is never changed by a rescore.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "rescores",
        sa.Column("id", _row_id, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("scorer", sa.String(64), nullable=False),
        sa.Column("key", sa.String(300), nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("reward_json", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_rescores_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rescores")),
        sa.UniqueConstraint("run_id", "scorer", "key", name=op.f("uq_rescores_run_id_scorer_key")),
    )


def downgrade() -> None:
    op.drop_table("rescores")
