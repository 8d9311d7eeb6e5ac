"""Environment versions looked up in the catalog: a page of them in order (`catalog ls`), how many, and the
version holding a given content (the key an episode's trajectory records as `env_key`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import func
from sqlmodel import Session, select

from worldsmith.models.catalog import EnvironmentVersion


def version_with_content(session: Session, content_key: str) -> EnvironmentVersion | None:
    """The version whose bundle has `content_key` (None: no such version in this catalog)."""
    return session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_key == content_key)).first()


def listed_versions(
    session: Session, status: str | None = None, limit: int | None = None, offset: int = 0
) -> list[Any]:
    """One page of `catalog ls`: the versions (of `status` when given) by environment id and version number,
    `limit` rows from `offset` (None: every row), as plain rows of the listed columns (no ORM objects)."""
    query = select(  # type: ignore[call-overload]  # sqlmodel types select() for up to 4 columns
        EnvironmentVersion.env_id,
        EnvironmentVersion.version,
        EnvironmentVersion.status,
        EnvironmentVersion.failed_stage,
        EnvironmentVersion.failure_reason,
        EnvironmentVersion.stats,
        EnvironmentVersion.quality,
        EnvironmentVersion.created_at,
    )
    if status is not None:
        query = query.where(EnvironmentVersion.status == status)
    query = query.order_by(EnvironmentVersion.env_id, EnvironmentVersion.version).offset(offset)
    return list(session.exec(query if limit is None else query.limit(limit)).all())


def count_versions(session: Session, status: str | None = None) -> int:
    """How many versions there are (of `status` when given)."""
    query = select(func.count()).select_from(EnvironmentVersion)
    return session.exec(query if status is None else query.where(EnvironmentVersion.status == status)).one()
