"""Publishing environment versions: artifacts to the object store, then the catalog rows in one
transaction, so no row ever points at a missing artifact. Fetching reverses it.

Publishing identical content (same artifact hashes) again returns the existing version; versions
are immutable; a new version of an env gets the next number. The stored manifest carries the
assigned version and the quality summary; artifacts are stored exactly as given.

With `dedupe`, a good bundle whose artifacts are identical to a good version of another env
(published with `dedupe` too) is not published again: the existing version is returned, marked
`duplicate`. A world whose generation stopped before it was a bundle is published as failed with
its partial artifacts (`publish_failed`): listed and counted, never fetched as a bundle.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, func, select

from worldsmith.bundle.contract import MANIFEST, Bundle, artifact_digest, sha256_hex
from worldsmith.bundle.loader import load_bundle, manifest_bytes
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import Manifest
from worldsmith.models.catalog import Artifact, Environment, EnvironmentVersion, QualityReport
from worldsmith.models.quality import QualityCheck
from worldsmith.models.sets import VersionStatus
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import ObjectStore


class CatalogError(WorldsmithError, LookupError):
    """A reference that names nothing in the catalog, or a request the catalog refuses."""


@dataclass
class Published:
    """The version a publish ended at: created now, or found (same content; with `duplicate`, the good
    version of another env holding the identical artifacts)."""

    version: EnvironmentVersion
    created: bool
    duplicate: bool = False


@dataclass
class _Release:
    """One version to publish: its manifest (artifact hashes set), files and catalog fields."""

    manifest: Manifest
    files: dict[str, bytes]
    key: str
    status: VersionStatus
    reason: str | None
    quality: dict[str, JsonObject] = field(default_factory=dict)
    checks: list[QualityCheck] = field(default_factory=list)
    failed_stage: str | None = None
    content_digest: str | None = None  # set: dedupe against versions holding the same digest


def content_digest(artifacts: dict[str, str]) -> str:
    """sha256 over the artifact hashes alone (no env_id, no manifest): equal for byte-identical worlds
    published under different env_ids."""
    return sha256_hex(json.dumps(artifacts, sort_keys=True).encode())


def _existing(session: Session, content_key: str) -> EnvironmentVersion | None:
    return session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_key == content_key)).first()


def _duplicate(session: Session, digest: str | None) -> EnvironmentVersion | None:
    if digest is None:
        return None
    return session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_digest == digest)).first()


def _next_version(session: Session, env_id: str) -> int:
    latest = session.exec(select(func.max(EnvironmentVersion.version)).where(EnvironmentVersion.env_id == env_id)).one()
    return (latest or 0) + 1


def _upload(store: ObjectStore, files: dict[str, bytes], manifest: Manifest, data: bytes) -> dict[str, tuple[str, int]]:
    """Every artifact and the manifest (`data`) into the store: {file name: (digest, size)}."""
    stored = {name: (store.put_bytes(content), len(content)) for name, content in sorted(files.items())}
    stored[MANIFEST] = (store.put_bytes(data), len(data))
    for name, (digest, _) in stored.items():
        expected = manifest.artifacts.get(name)
        if expected is not None and expected != digest:
            raise CatalogError(f"{name}: stored as {digest} but the manifest says {expected}")
    return stored


def _publish(release: _Release, store: ObjectStore, catalog: Catalog, attempts: int) -> Published:
    """Publish `release` once: idempotent by content key (and by content digest when set), safe under
    concurrent publishers (a unique key taken meanwhile sends it round again)."""
    env_id = release.manifest.env_id
    for _ in range(attempts):
        with catalog.session() as session:
            existing = _existing(session, release.key)
            if existing is not None:
                return Published(existing, created=False)
            duplicate = _duplicate(session, release.content_digest)
            if duplicate is not None:
                return Published(duplicate, created=False, duplicate=True)
            number = _next_version(session, env_id)
        manifest = release.manifest.model_copy(update={"version": number, "quality": release.quality})
        data = manifest_bytes(manifest)
        stored = _upload(store, release.files, manifest, data)  # artifacts first: a failure here leaves no rows
        try:
            with catalog.session() as session:
                if session.get(Environment, env_id) is None:
                    scenario = manifest.scenario
                    session.add(
                        Environment(
                            env_id=env_id,
                            scenario_name=scenario.name,
                            description=scenario.description,
                            categories=list(scenario.categories),
                        )
                    )
                    session.flush()
                generator = manifest.generator
                version = EnvironmentVersion(
                    env_id=env_id,
                    version=number,
                    content_key=release.key,
                    content_digest=release.content_digest,
                    manifest_digest=stored[MANIFEST][0],
                    status=release.status,
                    failure_reason=release.reason,
                    failed_stage=release.failed_stage,
                    generator_backend=generator.backend,
                    generator_model=generator.model,
                    prompt_version=generator.prompt_version,
                    seed=generator.seed,
                    stats=dict(manifest.stats),
                    quality=release.quality,
                )
                session.add(version)
                session.flush()
                assert version.id is not None  # flushed: numbered
                for name, (digest, size) in stored.items():
                    session.add(Artifact(version_id=version.id, name=name, digest=digest, size=size))
                for check in release.checks:
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
    raise CatalogError(f"could not publish {env_id} after {attempts} attempts (concurrent publishers?)")


def publish(
    bundle: Bundle,
    store: ObjectStore,
    catalog: Catalog,
    checks: Sequence[QualityCheck] = (),
    *,
    dedupe: bool = False,
    attempts: int = 8,
) -> Published:
    """Publish `bundle` with the outcome of its quality `checks`; a failed check publishes it as failed.

    Idempotent and safe under concurrent publishers: identical content yields one version. With
    `dedupe`, a good bundle whose artifacts a good version of any env (published with `dedupe`)
    already holds is not published again: that version comes back as `duplicate`.
    """
    failed = [c for c in checks if not c.passed]
    status: VersionStatus = "failed" if failed else "good"
    reason = "; ".join(f"{c.kind}: {c.summary.get('reason', 'failed')}" for c in failed) or None
    quality = {c.kind: {"passed": c.passed, **{k: v for k, v in c.summary.items() if k != "reason"}} for c in checks}
    release = _Release(
        manifest=bundle.manifest,
        files=bundle.files,
        key=bundle.key,
        status=status,
        reason=reason,
        quality=quality,
        checks=list(checks),
        content_digest=content_digest(bundle.manifest.artifacts) if dedupe and status == "good" else None,
    )
    return _publish(release, store, catalog, attempts)


def publish_failed(
    manifest: Manifest,
    files: dict[str, bytes],
    stage: str,
    reason: str,
    store: ObjectStore,
    catalog: Catalog,
    *,
    attempts: int = 8,
) -> Published:
    """Publish a world whose generation stopped at `stage` (for `reason`) before it was a bundle, as a
    failed version holding `files`, the partial artifacts of the stages before it, with `manifest`
    (identity and provenance; its artifact hashes are set here). Idempotent: the same env, files,
    stage and reason give one version."""
    artifacts = {name: artifact_digest(data) for name, data in sorted(files.items())}
    identity = {"env_id": manifest.env_id, "artifacts": artifacts, "failed_stage": stage, "reason": reason}
    release = _Release(
        manifest=manifest.model_copy(update={"artifacts": artifacts}),
        files=files,
        key=sha256_hex(json.dumps(identity, sort_keys=True).encode()),
        status="failed",
        reason=reason,
        failed_stage=stage,
    )
    return _publish(release, store, catalog, attempts)


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
        query = query.where(EnvironmentVersion.status == "good").order_by(col(EnvironmentVersion.version).desc())
    else:
        query = query.where(EnvironmentVersion.version == number)
    found = session.exec(query).first()
    if found is None:
        raise CatalogError(
            f"no environment version {ref!r} in the catalog"
            + (" (no good version)" if number is None else "")
            + "; `worldsmith catalog ls` lists them"
        )
    return found


def artifacts_of(session: Session, version: EnvironmentVersion) -> dict[str, str]:
    rows = session.exec(select(Artifact).where(Artifact.version_id == version.id)).all()
    return {row.name: row.digest for row in rows}


def partial_refusal(version: EnvironmentVersion) -> str:
    """Why a failed world with partial artifacts loads as no bundle."""
    return (
        f"{version.ref} is a failed world that stopped at stage {version.failed_stage} before it was a bundle "
        f"({version.failure_reason}); it has only partial artifacts (`catalog show {version.ref}` lists them)"
    )


def fetch_files(ref: str, target: Path, store: ObjectStore, catalog: Catalog) -> EnvironmentVersion:
    """Write every artifact of version `ref` into directory `target`, byte for byte as published (a
    failed world's partial artifacts too); returns the version."""
    with catalog.session() as session:
        version = resolve(session, ref)
        files = artifacts_of(session, version)
    target.mkdir(parents=True, exist_ok=True)
    for name, digest in sorted(files.items()):
        store.get_file(digest, target / name)
    return version


def fetch(ref: str, target: Path, store: ObjectStore, catalog: Catalog) -> Bundle:
    """Write version `ref` into directory `target` (byte for byte as published) and load it. A failed
    world with partial artifacts is refused (CatalogError) before anything is written."""
    with catalog.session() as session:
        version = resolve(session, ref)
    if version.failed_stage is not None:
        raise CatalogError(partial_refusal(version))
    fetch_files(version.ref, target, store, catalog)
    return load_bundle(target)


class GeneratorRecord(TypedDict):
    """Who wrote a version (its generator columns)."""

    backend: str
    model: str | None
    prompt_version: str | None
    seed: int | None


class ReportRecord(TypedDict):
    """One quality report of a version."""

    kind: str
    passed: bool
    summary: JsonObject
    details: list[JsonObject]


class VersionRecord(TypedDict):
    """A version as JSON (`catalog show --json`, a catalog export's `versions`)."""

    ref: str
    env_id: str
    version: int
    status: str
    failure_reason: str | None
    failed_stage: str | None
    content_key: str
    content_digest: str | None
    manifest: str  # the manifest's digest
    generator: GeneratorRecord
    stats: dict[str, int]
    quality: dict[str, JsonObject]
    created_at: str  # ISO 8601
    artifacts: dict[str, str]  # digest by file name
    reports: list[ReportRecord]


def version_record(session: Session, version: EnvironmentVersion) -> VersionRecord:
    """A JSON-ready description of a version with its artifacts and quality reports."""
    reports = session.exec(select(QualityReport).where(QualityReport.version_id == version.id)).all()
    return {
        "ref": version.ref,
        "env_id": version.env_id,
        "version": version.version,
        "status": version.status,
        "failure_reason": version.failure_reason,
        "failed_stage": version.failed_stage,
        "content_key": version.content_key,
        "content_digest": version.content_digest,
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
