"""Moving catalogs between installations (laptop to cluster): export a directory with every
object and record, import it elsewhere without duplicates (content keys and set names decide)."""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from sqlmodel import col, select

from worldsmith.bundle.loader import manifest_bytes
from worldsmith.models.bundle import Manifest
from worldsmith.models.catalog import (
    Artifact,
    Environment,
    EnvironmentSet,
    EnvironmentSetMember,
    EnvironmentVersion,
    QualityReport,
)
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore, ObjectStore
from worldsmith.storage.publish import CatalogError, _next_version, version_record
from worldsmith.storage.sets import members_of

FORMAT = "worldsmith-catalog-export/1"


def export_catalog(target: Path, store: ObjectStore, catalog: Catalog) -> dict[str, int]:
    """Write every environment, version (with its objects and reports) and set into `target`."""
    objects = LocalStore(target / "objects")
    with catalog.session() as session:
        envs = session.exec(select(Environment).order_by(Environment.env_id)).all()
        versions = session.exec(
            select(EnvironmentVersion).order_by(col(EnvironmentVersion.env_id), col(EnvironmentVersion.version))
        ).all()
        records = [version_record(session, v) for v in versions]
        sets = [
            {
                "name": s.name,
                "query": s.query,
                "created_at": s.created_at.isoformat(),
                "members": [{"content_key": v.content_key, "split": split} for v, split in members_of(session, s)],
            }
            for s in session.exec(select(EnvironmentSet).order_by(EnvironmentSet.name)).all()
        ]
    copied = 0
    for record in records:
        for digest in {*record["artifacts"].values(), record["manifest"]}:
            if not objects.exists(digest):
                objects.put_bytes(store.get_bytes(digest))
                copied += 1
    document = {
        "format": FORMAT,
        "environments": [
            {
                "env_id": e.env_id,
                "scenario_name": e.scenario_name,
                "description": e.description,
                "categories": e.categories,
                "created_at": e.created_at.isoformat(),
            }
            for e in envs
        ],
        "versions": records,
        "sets": sets,
    }
    (target / "catalog.json").write_text(json.dumps(document, indent=2) + "\n")
    return {"environments": len(envs), "versions": len(records), "sets": len(sets), "objects": copied}


def import_catalog(source: Path, store: ObjectStore, catalog: Catalog) -> dict[str, int]:
    """Bring an export into this installation. Versions whose content is already here and sets
    whose name exists are skipped; a version number taken here is replaced by the next free one."""
    path = source / "catalog.json"
    if not path.is_file():
        raise CatalogError(f"{source} is not a catalog export (no catalog.json)")
    document = json.loads(path.read_text())
    if document.get("format") != FORMAT:
        raise CatalogError(f"{path}: unsupported format {document.get('format')!r}")
    objects = LocalStore(source / "objects")
    counts = {"versions_added": 0, "versions_skipped": 0, "renumbered": 0, "sets_added": 0, "sets_skipped": 0}
    envs = {e["env_id"]: e for e in document["environments"]}
    ids: dict[str, int] = {}
    for record in document["versions"]:
        with catalog.session() as session:
            existing = session.exec(
                select(EnvironmentVersion).where(EnvironmentVersion.content_key == record["content_key"])
            ).first()
            if existing is not None:
                assert existing.id is not None  # a stored row has its id
                ids[record["content_key"]] = existing.id
                counts["versions_skipped"] += 1
                continue
        sizes: dict[str, int] = {}
        for digest in {*record["artifacts"].values(), record["manifest"]}:
            data = objects.get_bytes(digest)  # verified on read
            store.put_bytes(data)
            sizes[digest] = len(data)
        with catalog.session() as session:
            env = envs[record["env_id"]]
            if session.get(Environment, env["env_id"]) is None:
                session.add(
                    Environment(
                        env_id=env["env_id"],
                        scenario_name=env["scenario_name"],
                        description=env["description"],
                        categories=env["categories"],
                        created_at=datetime.fromisoformat(env["created_at"]),
                    )
                )
                session.flush()
            number, manifest_digest = record["version"], record["manifest"]
            taken = session.exec(
                select(EnvironmentVersion).where(
                    EnvironmentVersion.env_id == record["env_id"], EnvironmentVersion.version == number
                )
            ).first()
            artifacts = dict(record["artifacts"])
            if taken is not None:
                number = _next_version(session, record["env_id"])
                manifest = Manifest.model_validate_json(store.get_bytes(manifest_digest)).model_copy(
                    update={"version": number}
                )
                data = manifest_bytes(manifest)
                manifest_digest = store.put_bytes(data)
                sizes[manifest_digest] = len(data)
                artifacts["manifest.json"] = manifest_digest
                counts["renumbered"] += 1
            generator = record["generator"]
            digest = record.get("content_digest")
            if (
                digest
                and session.exec(select(EnvironmentVersion).where(EnvironmentVersion.content_digest == digest)).first()
            ):
                digest = None  # a version here already holds this content: the copy keeps its own, undigested
            version = EnvironmentVersion(
                env_id=record["env_id"],
                version=number,
                content_key=record["content_key"],
                manifest_digest=manifest_digest,
                status=record["status"],
                failure_reason=record["failure_reason"],
                failed_stage=record.get("failed_stage"),
                content_digest=digest,
                generator_backend=generator["backend"],
                generator_model=generator["model"],
                prompt_version=generator["prompt_version"],
                seed=generator["seed"],
                stats=record["stats"],
                quality=record["quality"],
                created_at=datetime.fromisoformat(record["created_at"]),
            )
            session.add(version)
            session.flush()
            assert version.id is not None  # flushed: numbered
            for name, digest in artifacts.items():
                session.add(Artifact(version_id=version.id, name=name, digest=digest, size=sizes[digest]))
            for report in record["reports"]:
                session.add(
                    QualityReport(
                        version_id=version.id,
                        kind=report["kind"],
                        passed=report["passed"],
                        summary=report["summary"],
                        details=report["details"],
                    )
                )
            ids[record["content_key"]] = version.id
            counts["versions_added"] += 1
    for entry in document["sets"]:
        with catalog.session() as session:
            if session.exec(select(EnvironmentSet).where(EnvironmentSet.name == entry["name"])).first() is not None:
                counts["sets_skipped"] += 1
                continue
            env_set = EnvironmentSet(
                name=entry["name"], query=entry["query"], created_at=datetime.fromisoformat(entry["created_at"])
            )
            session.add(env_set)
            session.flush()
            assert env_set.id is not None  # flushed: numbered
            for member in entry["members"]:
                session.add(
                    EnvironmentSetMember(
                        set_id=env_set.id, version_id=ids[member["content_key"]], split=member["split"]
                    )
                )
            counts["sets_added"] += 1
    return counts
