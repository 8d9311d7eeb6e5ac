"""Environment versions looked up in the catalog: every version in order, and the version holding
a given content (the key an episode's trajectory records as `env_key`)."""

from __future__ import annotations

from sqlmodel import Session, select

from worldsmith.models.catalog import EnvironmentVersion


def all_versions(session: Session) -> list[EnvironmentVersion]:
    """Every environment version, by environment id and version number."""
    query = select(EnvironmentVersion).order_by(EnvironmentVersion.env_id, EnvironmentVersion.version)
    return list(session.exec(query).all())


def version_with_content(session: Session, content_key: str) -> EnvironmentVersion | None:
    """The version whose bundle has `content_key` (None: no such version in this catalog)."""
    return session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_key == content_key)).first()
