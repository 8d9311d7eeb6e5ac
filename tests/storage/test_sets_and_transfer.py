"""Environment sets (query, deterministic split, immutability, export) and moving catalogs
between installations."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
from sqlmodel import select

from worldsmith.bundle.loader import build_bundle
from worldsmith.models.catalog import EnvironmentSet, EnvironmentVersion
from worldsmith.models.quality import QualityCheck
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore
from worldsmith.storage.publish import CatalogError, publish
from worldsmith.storage.sets import SetQuery, create_set, export_set, get_set, members_of, set_manifest
from worldsmith.storage.transfer import export_catalog, import_catalog

pytestmark = pytest.mark.unit

SOURCES = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")


def variant(golden, env_id: str, categories: list[str], seed_tweak: int = 0):
    sources = {n: golden.files[n] for n in SOURCES}
    if seed_tweak:
        sources["seed.sql"] = sources["seed.sql"].replace(
            b"('SAVE10',   10,", f"('SAVE10',   {10 + seed_tweak},".encode()
        )
    scenario = golden.manifest.scenario.model_copy(update={"categories": categories})
    return build_bundle(sources, golden.manifest.model_copy(update={"env_id": env_id, "scenario": scenario}))


@pytest.fixture()
def populated(catalog, golden, tmp_path):
    store = LocalStore(tmp_path / "store")
    for i in range(10):
        category = "retail" if i % 2 == 0 else "travel"
        publish(variant(golden, f"world_{i:02d}", [category]), store, catalog)
    publish(variant(golden, "world_00", ["retail"], seed_tweak=1), store, catalog)  # world_00@2
    publish(
        variant(golden, "broken_world", ["retail"]), store, catalog, [QualityCheck("probes", False, {"reason": "x"})]
    )
    return store, catalog


def test_set_from_query_with_deterministic_split(populated):
    _store, catalog = populated
    query = SetQuery(categories=["retail"], validation_fraction=0.4, seed=7)
    create_set(catalog, "retail-v1", query)
    with catalog.session() as session:
        members = members_of(session, get_set(session, "retail-v1"))
    refs = [v.ref for v, _ in members]
    assert refs == [
        "world_00@2",
        "world_02@1",
        "world_04@1",
        "world_06@1",
        "world_08@1",
    ]  # latest good only; failed excluded
    assert sum(split == "validation" for _, split in members) == 2
    create_set(catalog, "retail-v1-again", query)
    with catalog.session() as session:
        again = members_of(session, get_set(session, "retail-v1-again"))
    assert [(v.ref, s) for v, s in again] == [(v.ref, s) for v, s in members]


def test_a_set_holds_the_versions_its_query_samples_or_picks_by_status(populated):
    _, catalog = populated
    create_set(catalog, "sample", SetQuery(count=4, seed=3, validation_fraction=0.25))
    with catalog.session() as session:
        members = members_of(session, get_set(session, "sample"))
    assert len(members) == 4 and sum(s == "validation" for _, s in members) == 1
    create_set(catalog, "failed-ones", SetQuery(status="failed"))
    with catalog.session() as session:
        assert [v.ref for v, _ in members_of(session, get_set(session, "failed-ones"))] == ["broken_world@1"]


def test_a_set_that_cannot_be_made_is_refused_naming_why(populated):
    _, catalog = populated
    create_set(catalog, "taken", SetQuery(count=1))
    with pytest.raises(CatalogError, match="already exists"):
        create_set(catalog, "taken", SetQuery())
    with pytest.raises(CatalogError, match="fewer than count=50"):
        create_set(catalog, "too-many", SetQuery(count=50))
    with pytest.raises(CatalogError, match="no environment version matches"):
        create_set(catalog, "nothing", SetQuery(categories=["space"]))


def test_export_set_for_external_trainers(populated, tmp_path):
    store, catalog = populated
    create_set(catalog, "travel", SetQuery(categories=["travel"], validation_fraction=0.2))
    manifest = export_set("travel", tmp_path / "out", store, catalog)
    out = tmp_path / "out"
    assert json.loads((out / "set.json").read_text()) == manifest
    assert [m["ref"] for m in manifest["members"]] == [
        "world_01@1",
        "world_03@1",
        "world_05@1",
        "world_07@1",
        "world_09@1",
    ]
    rows = [json.loads(line) for line in (out / "tasks.jsonl").read_text().splitlines()]
    assert len(rows) == 50 and {r["task_id"] for r in rows} >= {"t01_points_balance", "t10_points_order"}
    table = pq.read_table(out / "tasks.parquet")
    assert table.num_rows == 50 and table.column("split").to_pylist() == [r["split"] for r in rows]
    for member in manifest["members"]:
        assert (out / "bundles" / member["ref"] / "world.db").is_file()
    env_splits = {}
    for r in rows:
        env_splits.setdefault(r["env_id"], set()).add(r["split"])
    assert all(len(s) == 1 for s in env_splits.values())  # split by environment, never by task


def test_export_then_import_moves_everything_without_duplicates(populated, tmp_path):
    store, catalog = populated
    create_set(catalog, "all-retail", SetQuery(categories=["retail"]))
    counts = export_catalog(tmp_path / "export", store, catalog)
    assert counts["versions"] == 12 and counts["sets"] == 1
    target_store = LocalStore(tmp_path / "cluster-store")
    target = Catalog(f"sqlite:///{tmp_path / 'cluster.db'}")
    first = import_catalog(tmp_path / "export", target_store, target)
    assert first["versions_added"] == 12 and first["sets_added"] == 1
    second = import_catalog(tmp_path / "export", target_store, target)
    assert second["versions_added"] == 0 and second["versions_skipped"] == 12 and second["sets_skipped"] == 1
    with catalog.session() as s1, target.session() as s2:
        a = set_manifest(s1, get_set(s1, "all-retail"))
        b = set_manifest(s2, get_set(s2, "all-retail"))
        assert a["members"] == b["members"]
        assert len(s2.exec(select(EnvironmentVersion)).all()) == 12
        assert len(s2.exec(select(EnvironmentSet)).all()) == 1


def test_import_renumbers_a_taken_version(golden, tmp_path):
    source_store, target_store = LocalStore(tmp_path / "a"), LocalStore(tmp_path / "b")
    source, target = Catalog(f"sqlite:///{tmp_path / 'a.db'}"), Catalog(f"sqlite:///{tmp_path / 'b.db'}")
    publish(variant(golden, "shared_world", ["retail"], seed_tweak=1), source_store, source)
    publish(variant(golden, "shared_world", ["retail"], seed_tweak=2), target_store, target)
    export_catalog(tmp_path / "export", source_store, source)
    counts = import_catalog(tmp_path / "export", target_store, target)
    assert counts["versions_added"] == 1 and counts["renumbered"] == 1
    from worldsmith.storage.publish import fetch

    moved = fetch("shared_world@2", tmp_path / "moved", target_store, target)
    assert moved.manifest.version == 2


def test_import_rejects_a_directory_that_is_not_an_export(tmp_path, catalog):
    with pytest.raises(CatalogError, match="not a catalog export"):
        import_catalog(tmp_path, LocalStore(tmp_path / "s"), catalog)
