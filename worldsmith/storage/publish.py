"""Publishing environment versions: artifacts to the object store, then the catalog rows in one
transaction, so no row ever points at a missing artifact. Fetching reverses it.

Publishing identical content (same artifact hashes) again returns the existing version; versions
are immutable; a new version of an env gets the next number. The stored manifest carries the
assigned version and the quality summary; artifacts are stored exactly as given.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, func, select

from worldsmith.bundle.contract import MANIFEST, Bundle
from worldsmith.bundle.loader import load_bundle, manifest_bytes
from worldsmith.models.catalog import Artifact, Environment, EnvironmentVersion, QualityReport
from worldsmith.models.quality import QualityCheck
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore


class CatalogError(LookupError):
    """A reference that names nothing in the catalog, or a request the catalog refuses."""


@dataclass
class Published:
    version: EnvironmentVersion
    created: bool


def _existing(session: Session, content_key: str) -> EnvironmentVersion | None:
    return session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_key == content_key)).first()


def _next_version(session: Session, env_id: str) -> int:
    latest = session.exec(select(func.max(EnvironmentVersion.version)).where(EnvironmentVersion.env_id == env_id)).one()
    return (latest or 0) + 1


def _upload(store: ObjectStore, bundle: Bundle, manifest: bytes) -> dict[str, tuple[str, int]]:
    """Every artifact and the manifest into the store: {file name: (digest, size)}."""
    stored = {name: (store.put_bytes(data), len(data)) for name, data in sorted(bundle.files.items())}
    stored[MANIFEST] = (store.put_bytes(manifest), len(manifest))
    for name, (digest, _) in stored.items():
        expected = bundle.manifest.artifacts.get(name)
        if expected is not None and expected != digest:
            raise CatalogError(f"{name}: stored as {digest} but the manifest says {expected}")
    return stored


def publish(
    bundle: Bundle, store: ObjectStore, catalog: Catalog, checks: list[QualityCheck] = (), *, attempts: int = 8
) -> Published:
    """Publish `bundle` with the outcome of its quality `checks`; a failed check publishes it as failed.

    Idempotent and safe under concurrent publishers: identical content yields one version.
    """
    failed = [c for c in checks if not c.passed]
    status = "failed" if failed else "good"
    reason = "; ".join(f"{c.kind}: {c.summary.get('reason', 'failed')}" for c in failed) or None
    quality = {c.kind: {"passed": c.passed, **{k: v for k, v in c.summary.items() if k != "reason"}} for c in checks}
    for _ in range(attempts):
        with catalog.session() as session:
            existing = _existing(session, bundle.key)
            if existing is not None:
                return Published(existing, created=False)
            number = _next_version(session, bundle.env_id)
        manifest = bundle.manifest.model_copy(update={"version": number, "quality": quality})
        data = manifest_bytes(manifest)
        stored = _upload(store, bundle, data)  # artifacts first: a failure here leaves no rows
        try:
            with catalog.session() as session:
                if session.get(Environment, bundle.env_id) is None:
                    scenario = bundle.manifest.scenario
                    session.add(
                        Environment(
                            env_id=bundle.env_id,
                            scenario_name=scenario.name,
                            description=scenario.description,
                            categories=list(scenario.categories),
                        )
                    )
                    session.flush()
                generator = bundle.manifest.generator
                version = EnvironmentVersion(
                    env_id=bundle.env_id,
                    version=number,
                    content_key=bundle.key,
                    manifest_digest=stored[MANIFEST][0],
                    status=status,
                    failure_reason=reason,
                    generator_backend=generator.backend,
                    generator_model=generator.model,
                    prompt_version=generator.prompt_version,
                    seed=generator.seed,
                    stats=dict(bundle.manifest.stats),
                    quality=quality,
                )
                session.add(version)
                session.flush()
                for name, (digest, size) in stored.items():
                    session.add(Artifact(version_id=version.id, name=name, digest=digest, size=size))
                for check in checks:
                    session.add(
                        QualityReport(
                            version_id=version.id,
                            kind=check.kind,
                            passed=check.passed,
                            summary=check.summary,
                            details=check.details,
                        )
                    )
            return Published(version, created=True)
        except IntegrityError:
            continue  # another publisher took this content or this number: look again
    raise CatalogError(f"could not publish {bundle.env_id} after {attempts} attempts (concurrent publishers?)")


#: Versions are SQL integers: a larger number names no version.
MAX_VERSION = 2**63


def parse_ref(ref: str) -> tuple[str, int | None]:
    """`env` or `env@version` -> (env_id, version or None for the latest good one)."""
    env_id, _, version = ref.partition("@")
    if version and not (version.isdigit() and int(version) < MAX_VERSION):
        raise CatalogError(f"bad reference {ref!r}: expected ENV or ENV@VERSION (VERSION a number below 2**63)")
    return env_id, int(version) if version else None


def resolve(session: Session, ref: str) -> EnvironmentVersion:
    """The version `ref` names (`env@3`, or `env` for its latest good version)."""
    env_id, number = parse_ref(ref)
    query = select(EnvironmentVersion).where(EnvironmentVersion.env_id == env_id)
    if number is None:
        query = query.where(EnvironmentVersion.status == "good").order_by(EnvironmentVersion.version.desc())
    else:
        query = query.where(EnvironmentVersion.version == number)
    found = session.exec(query).first()
    if found is None:
        raise CatalogError(
            f"no environment version {ref!r} in the catalog" + (" (no good version)" if number is None else "")
        )
    return found


def artifacts_of(session: Session, version: EnvironmentVersion) -> dict[str, str]:
    rows = session.exec(select(Artifact).where(Artifact.version_id == version.id)).all()
    return {row.name: row.digest for row in rows}


def fetch(ref: str, target: Path, store: ObjectStore, catalog: Catalog) -> Bundle:
    """Write version `ref` into directory `target` (byte for byte as published) and load it."""
    with catalog.session() as session:
        version = resolve(session, ref)
        files = artifacts_of(session, version)
    target.mkdir(parents=True, exist_ok=True)
    for name, digest in sorted(files.items()):
        store.get_file(digest, target / name)
    return load_bundle(target)


def version_record(session: Session, version: EnvironmentVersion) -> dict[str, Any]:
    """A JSON-ready description of a version with its artifacts and quality reports."""
    reports = session.exec(select(QualityReport).where(QualityReport.version_id == version.id)).all()
    return {
        "ref": version.ref,
        "env_id": version.env_id,
        "version": version.version,
        "status": version.status,
        "failure_reason": version.failure_reason,
        "content_key": version.content_key,
        "manifest": version.manifest_digest,
        "generator": {
            "backend": version.generator_backend,
            "model": version.generator_model,
            "prompt_version": version.prompt_version,
            "seed": version.seed,
        },
        "stats": version.stats,
        "quality": version.quality,
        "created_at": version.created_at.isoformat(),
        "artifacts": artifacts_of(session, version),
        "reports": [{"kind": r.kind, "passed": r.passed, "summary": r.summary, "details": r.details} for r in reports],
    }
