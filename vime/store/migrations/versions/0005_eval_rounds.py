"""Evaluation: eval samples marked with their round, and each round's figures recorded once.

Revision ID: 0005
Revises: 0004

Adds one nullable column to `samples` (`eval_step`: the step of the eval round a sample was
generated for; NULL for a training sample), an index to find a round's samples, and the table
`eval_rounds` ((run_id, step) unique, first write wins). A store at 0004 is upgraded in place on
its next open; its samples read back as training samples.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_row_id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("eval_step", sa.Integer(), nullable=True))
        batch.create_index(op.f("ix_samples_run_id_eval_step"), ["run_id", "eval_step"])
    op.create_table(
        "eval_rounds",
        sa.Column("id", _row_id, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(255), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("weight_version", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], name=op.f("fk_eval_rounds_run_id_runs")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_eval_rounds")),
        sa.UniqueConstraint("run_id", "step", name=op.f("uq_eval_rounds_run_id_step")),
    )


def downgrade() -> None:
    op.drop_table("eval_rounds")
    with op.batch_alter_table("samples") as batch:
        batch.drop_index(op.f("ix_samples_run_id_eval_step"))
        batch.drop_column("eval_step")
