"""attempt artifacts: what each stage attempt sent and got (the prompt's messages, the model's answer, the
files it wrote, the check's evidence), stored in the object store and linked to its stage_attempts row

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-05 17:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "attempt_artifacts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("attempt_id", sa.Integer(), nullable=False),
        sa.Column("name", sqlmodel.sql.sqltypes.AutoString(length=128), nullable=False),
        sa.Column("kind", sqlmodel.sql.sqltypes.AutoString(length=16), nullable=False),
        sa.Column("digest", sqlmodel.sql.sqltypes.AutoString(length=71), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("full_size", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["attempt_id"], ["stage_attempts.id"]),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("attempt_id", "name"),
    )
    op.create_index("ix_attempt_artifacts_attempt_id", "attempt_artifacts", ["attempt_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_attempt_artifacts_attempt_id", table_name="attempt_artifacts")
    op.drop_table("attempt_artifacts")
