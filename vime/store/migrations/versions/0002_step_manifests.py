"""Step manifests: the ordered rollout ids each train step trains on, written once.

Revision ID: 0002
Revises: 0001

Adds one table and touches no existing one, so a store at 0001 (runs already under way) is
upgraded in place on its next open, inside the same locked transaction as any upgrade.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "step_manifests",
        sa.Column("id", _row_id, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("rollout_ids", sa.JSON(), nullable=False),
        sa.Column("weight_version", sa.Integer(), nullable=False),
        sa.Column("meta", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_step_manifests_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_step_manifests")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_step_manifests_run_id_step")),
    )


def downgrade() -> None:
    op.drop_table("step_manifests")
