"""Catalog and publishing, on SQLite and PostgreSQL alike: versions, idempotence, concurrency,
faults in the middle of a publish, fetch round trips, migrations."""

from __future__ import annotations

import threading

import pytest
from sqlmodel import select
from support.paths import GOLDEN

from worldsmith.bundle.loader import build_bundle, load_bundle
from worldsmith.models.catalog import Artifact, EnvironmentVersion
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore, S3Store
from worldsmith.storage.publish import CatalogError, fetch, publish, resolve

pytestmark = pytest.mark.unit

SOURCES = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")


def edited(golden, old: bytes, new: bytes):
    """A new version of the golden env: same env_id, different seed data."""
    sources = {n: golden.files[n] for n in SOURCES}
    assert old in sources["seed.sql"]
    sources["seed.sql"] = sources["seed.sql"].replace(old, new)
    return build_bundle(sources, golden.manifest)


@pytest.mark.sandbox
def test_publish_fetch_round_trip_byte_for_byte(catalog, golden, tmp_path):
    store = LocalStore(tmp_path / "store")
    first = publish(golden, store, catalog)
    assert first.created and first.version.ref == "retail_store@1" and first.version.status == "good"
    copy = fetch("retail_store@1", tmp_path / "copy", store, catalog)
    for name, data in golden.files.items():
        assert (tmp_path / "copy" / name).read_bytes() == data
    assert copy.key == golden.key and copy.manifest.version == 1
    again = fetch("retail_store", tmp_path / "again", store, catalog)
    assert (tmp_path / "again" / "manifest.json").read_bytes() == (tmp_path / "copy" / "manifest.json").read_bytes()
    assert again.manifest.version == 1


def test_publishing_identical_content_again_changes_nothing(catalog, golden, tmp_path):
    store = LocalStore(tmp_path / "store")
    v1 = publish(golden, store, catalog).version
    same = publish(load_bundle(GOLDEN), store, catalog)
    assert not same.created and same.version.id == v1.id
    with catalog.session() as session:
        assert [v.version for v in session.exec(select(EnvironmentVersion)).all()] == [1]


def test_new_content_is_published_as_the_next_version(catalog, golden, tmp_path):
    store = LocalStore(tmp_path / "store")
    publish(golden, store, catalog)
    v2 = publish(edited(golden, b"('SAVE10',   10,", b"('SAVE10',   11,"), store, catalog).version
    assert (v2.env_id, v2.version) == ("retail_store", 2)
    with catalog.session() as session:
        assert [v.version for v in session.exec(select(EnvironmentVersion)).all()] == [1, 2]
        assert resolve(session, "retail_store").version == 2
        assert resolve(session, "retail_store@1").content_key == golden.key
        with pytest.raises(CatalogError, match="no environment version 'retail_store@7'"):
            resolve(session, "retail_store@7")


def test_a_version_failing_its_checks_is_published_as_failed_never_as_latest_good(catalog, golden, tmp_path):
    from worldsmith.models.quality import QualityCheck

    store = LocalStore(tmp_path / "store")
    publish(golden, store, catalog)
    bad = publish(
        edited(golden, b"('BIG20',    20,", b"('BIG20',    25,"),
        store,
        catalog,
        [QualityCheck("expectations", False, {"reason": "2 expectations failed"}, [{"table": "x"}])],
    ).version
    assert bad.status == "failed" and "expectations: 2 expectations failed" in bad.failure_reason
    with catalog.session() as session:
        assert resolve(session, "retail_store").version == 1


def test_concurrent_publishers_of_the_same_content_make_one_version(catalog, golden, tmp_path):
    store = LocalStore(tmp_path / "store")
    results, errors = [], []

    def worker():
        try:
            results.append(publish(golden, store, catalog))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r.created for r in results) == 1
    assert len({r.version.id for r in results}) == 1
    with catalog.session() as session:
        assert len(session.exec(select(EnvironmentVersion)).all()) == 1


class FlakyS3(S3Store):
    """An S3 store whose uploads start failing after `good` objects (a network fault mid-publish)."""

    def __init__(self, *args, good: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.good = good

    def _write(self, digest, source, size):
        if self.good <= 0:
            from botocore.exceptions import EndpointConnectionError

            raise EndpointConnectionError(endpoint_url="http://127.0.0.1/s3")
        self.good -= 1
        super()._write(digest, source, size)


@pytest.mark.sandbox
def test_an_s3_fault_mid_publish_leaves_no_rows_for_the_retry_to_complete(catalog, golden, s3_bucket, s3_endpoint):
    from botocore.exceptions import EndpointConnectionError

    flaky = FlakyS3(s3_bucket, "worlds", endpoint_url=s3_endpoint, good=3)
    with pytest.raises(EndpointConnectionError):
        publish(golden, flaky, catalog)
    with catalog.session() as session:
        assert session.exec(select(EnvironmentVersion)).all() == []
        assert session.exec(select(Artifact)).all() == []
    healthy = S3Store(s3_bucket, "worlds", endpoint_url=s3_endpoint)
    done = publish(golden, healthy, catalog)
    assert done.created and done.version.version == 1
    with catalog.session() as session:
        for artifact in session.exec(select(Artifact)).all():
            assert healthy.exists(artifact.digest)


def test_fetch_of_a_missing_or_corrupted_object_fails_loudly(catalog, golden, tmp_path):
    from worldsmith.storage.objectstore import ObjectCorrupted, object_key

    store = LocalStore(tmp_path / "store")
    publish(golden, store, catalog)
    path = store.root / object_key(golden.manifest.artifacts["tools.py"])
    path.chmod(0o644)
    path.write_bytes(b"def evil(conn):\n    pass\n")
    with pytest.raises(ObjectCorrupted, match="corrupted"):
        fetch("retail_store@1", tmp_path / "copy", store, catalog)


def test_migrations_upgrade_an_existing_catalog_without_losing_rows(tmp_path, golden):
    from alembic import command

    from worldsmith.storage.catalog import alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Catalog(url, migrate=False)
    assert old.revision() is None
    old.upgrade()
    store = LocalStore(tmp_path / "store")
    publish(golden, store, old)
    with old.engine.begin() as connection:  # every migration down again: a first-schema catalog with a version
        config = alembic_config(url)
        config.attributes["connection"] = connection
        command.downgrade(config, "0001")
    assert old.revision() == "0001"
    old.close()
    reopened = Catalog(url)  # upgrades to head on open
    assert reopened.revision() == Catalog.head() == "0006"
    from sqlalchemy import inspect

    indexes = {i["name"] for i in inspect(reopened.engine).get_indexes("stage_attempts")}
    assert "ix_stage_attempts_stage_created_at" in indexes
    with reopened.session() as session:
        assert resolve(session, "retail_store@1").content_key == golden.key


def test_models_and_migrations_agree(catalog):
    """A model change without a migration fails here: autogenerate must find nothing to do."""
    from alembic.autogenerate import compare_metadata
    from alembic.runtime.migration import MigrationContext
    from sqlmodel import SQLModel

    with catalog.engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), SQLModel.metadata) == []


def renamed(golden, env_id: str):
    """The golden env's very artifacts under another env_id (what two scenarios mapped to one world give)."""
    return build_bundle({n: golden.files[n] for n in SOURCES}, golden.manifest.model_copy(update={"env_id": env_id}))


def test_identical_content_under_another_env_is_published_once_with_dedupe(catalog, golden, tmp_path):
    from worldsmith.models.quality import QualityCheck

    store = LocalStore(tmp_path / "store")
    first = publish(golden, store, catalog, dedupe=True)
    assert first.created and not first.duplicate
    again = publish(load_bundle(GOLDEN), store, catalog, dedupe=True)  # the same env again (a resumed run)
    assert (again.created, again.duplicate, again.version.id) == (False, False, first.version.id)

    results, errors = [], []

    def worker(i: int) -> None:
        try:
            results.append(publish(renamed(golden, f"twin_{i}"), store, catalog, dedupe=True))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and all(r.duplicate and not r.created and r.version.id == first.version.id for r in results)
    failing = [QualityCheck("probes", False, {"reason": "x"})]
    broken = publish(renamed(golden, "broken_twin"), store, catalog, failing, dedupe=True)
    assert broken.created and broken.version.status == "failed"  # only good content is deduplicated
    plain = publish(renamed(golden, "plain_twin"), store, catalog)  # without dedupe: published as before
    assert plain.created and plain.version.status == "good"
    with catalog.session() as session:
        assert sorted(v.env_id for v in session.exec(select(EnvironmentVersion)).all()) == [
            "broken_twin",
            "plain_twin",
            "retail_store",
        ]


def test_a_failed_world_with_partial_artifacts_is_listed_never_loaded(catalog, golden, tmp_path):
    from worldsmith.storage.publish import fetch_files, publish_failed, version_record

    store = LocalStore(tmp_path / "store")
    files = {"schema.sql": golden.files["schema.sql"], "work.json": b"{}\n"}
    manifest = golden.manifest.model_copy(update={"env_id": "half_world", "artifacts": {}, "stats": {"tasks": 3}})
    first = publish_failed(manifest, files, "tools", "stage tools failed after 2 attempts: boom", store, catalog)
    again = publish_failed(manifest, files, "tools", "stage tools failed after 2 attempts: boom", store, catalog)
    assert first.created and not again.created and again.version.id == first.version.id
    version = first.version
    assert (version.ref, version.status, version.failed_stage) == ("half_world@1", "failed", "tools")
    with catalog.session() as session:
        record = version_record(session, version)
        with pytest.raises(CatalogError, match="no good version"):
            resolve(session, "half_world")
    assert set(record["artifacts"]) == {"schema.sql", "work.json", "manifest.json"}
    assert record["failed_stage"] == "tools" and "boom" in record["failure_reason"]
    with pytest.raises(CatalogError, match="stopped at stage tools before it was a bundle"):
        fetch("half_world@1", tmp_path / "bundle", store, catalog)
    assert not (tmp_path / "bundle").exists()
    fetch_files("half_world@1", tmp_path / "partial", store, catalog)
    assert (tmp_path / "partial" / "schema.sql").read_bytes() == golden.files["schema.sql"]
