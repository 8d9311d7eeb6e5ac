"""index stage attempts by stage and time (dashboard queries: rates per stage per night)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 08:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("stage_attempts", schema=None) as batch_op:
        batch_op.create_index("ix_stage_attempts_stage_created_at", ["stage", "created_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("stage_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_stage_attempts_stage_created_at")
