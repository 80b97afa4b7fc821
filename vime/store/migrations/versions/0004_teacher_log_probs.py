"""Teacher log-probs: on-policy distillation stores the teacher's log-probs of each response token.

Revision ID: 0004
Revises: 0003

Adds one nullable column to `samples` (float32 little-endian, like `rollout_log_probs`): a store
at 0003 is upgraded in place on its next open, and its samples read back with
`teacher_log_probs=None`.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.add_column(sa.Column("teacher_log_probs", sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("samples") as batch:
        batch.drop_column("teacher_log_probs")
