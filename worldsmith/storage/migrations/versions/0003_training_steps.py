"""per-step metrics of training runs (one row per logged optimizer step)

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 12:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "training_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("training_run_id", sa.Integer(), nullable=False),
        sa.Column("step", sa.Integer(), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("created_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["training_run_id"], ["training_runs.id"]),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("training_steps", schema=None) as batch_op:
        batch_op.create_index("ix_training_steps_run_step", ["training_run_id", "step"], unique=True)


def downgrade() -> None:
    with op.batch_alter_table("training_steps", schema=None) as batch_op:
        batch_op.drop_index("ix_training_steps_run_step")
    op.drop_table("training_steps")
