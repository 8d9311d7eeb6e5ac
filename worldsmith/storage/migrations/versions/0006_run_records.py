"""run records: the status of runs with no run table of their own (generation, curation, and evaluation
or training runs refused before they opened theirs)

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-05 17:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "run_records",
        sa.Column("run_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("status", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("what", sqlmodel.sql.sqltypes.AutoString(length=256), nullable=False),
        sa.Column("metrics", sa.JSON(), nullable=False),
        sa.Column("flow_run_id", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True),
        sa.Column("started_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=False),
        sa.Column("finished_at", sqlmodel.sql.sqltypes.UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("run_id"),
    )
    with op.batch_alter_table("run_records", schema=None) as batch_op:
        batch_op.create_index("ix_run_records_kind_started_at", ["kind", "started_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("run_records", schema=None) as batch_op:
        batch_op.drop_index("ix_run_records_kind_started_at")
    op.drop_table("run_records")
