"""Run progress: a run's newest checkpoint and the state it finished with, kept in the store.

Revision ID: 0006
Revises: 0005

Adds two nullable JSON columns to `runs`: `checkpoint` (the newest checkpoint the trainer saved:
step, path, weight_version, data_position) and `finished` (the state the training workflow ended
with; NULL while the run has not finished). A training workflow started later reads them, so a
second start of a finished run trains nothing and a start from an older state resumes where the
store says the run stands (`workflows/durable_start.py`). A store at 0005 is upgraded in place on
its next open; its runs read back as not finished, without a recorded checkpoint.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("checkpoint", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("finished", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("finished")
        batch.drop_column("checkpoint")
