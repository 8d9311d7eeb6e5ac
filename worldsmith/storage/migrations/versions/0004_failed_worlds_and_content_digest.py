"""failed worlds and deduplicated content: environment_versions.failed_stage (a failed world published
with the partial artifacts of the stages before it) and content_digest (unique: one good generated
version per content, whatever its env_id)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 18:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
import sqlmodel
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("environment_versions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("content_digest", sqlmodel.sql.sqltypes.AutoString(length=64), nullable=True))
        batch_op.add_column(sa.Column("failed_stage", sqlmodel.sql.sqltypes.AutoString(length=32), nullable=True))
        batch_op.create_index("ix_environment_versions_content_digest", ["content_digest"], unique=True)


def downgrade() -> None:
    # plain ALTER TABLE ... DROP COLUMN (SQLite >= 3.35): a batch copy of the table would break the
    # foreign keys of the rows that reference it
    op.drop_index("ix_environment_versions_content_digest", table_name="environment_versions")
    op.drop_column("environment_versions", "failed_stage")
    op.drop_column("environment_versions", "content_digest")
