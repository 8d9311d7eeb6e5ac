"""The seed-data quality gate: each kind of planted defect is caught and named with its rows,
and a failing gate publishes the version as failed."""

from __future__ import annotations

import sqlite3

import pytest

from worldsmith.bundle.contract import Bundle
from worldsmith.quality.expectations import validate_world
from worldsmith.storage.objectstore import LocalStore
from worldsmith.storage.publish import publish


def plant(world: bytes, *statements: str, declare: tuple[str, str, str] | None = None) -> bytes:
    """Apply `statements` with constraint enforcement off; `declare` (table, old, new) rewrites a
    table's declared SQL afterwards, as a world imported from elsewhere might have it."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.deserialize(world)
    conn.execute("PRAGMA foreign_keys = OFF")
    conn.execute("PRAGMA ignore_check_constraints = ON")
    for statement in statements:
        conn.execute(statement)
    if declare:
        table, old, new = declare
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = replace(sql, ?, ?) WHERE name = ?", (old, new, table))
        conn.execute("PRAGMA writable_schema = OFF")
    data = conn.serialize()
    conn.close()
    return data


DEFECTS = {
    "empty_table": ({"statements": ("DELETE FROM reviews",)}, "reviews", "not_empty", None),
    "primary_key_null": (
        {"statements": ("UPDATE coupons SET code = NULL WHERE code = 'SPRING15'",)},
        "coupons",
        "primary_key_not_null",
        None,
    ),
    "primary_key_duplicate": (
        {
            "statements": (
                "CREATE TABLE gift_cards (code TEXT, balance INTEGER)",
                "INSERT INTO gift_cards VALUES ('GC-1', 100), ('GC-2', 50), ('GC-1', 75)",
            ),
            "declare": ("gift_cards", "code TEXT,", "code TEXT PRIMARY KEY,"),
        },
        "gift_cards",
        "primary_key_unique",
        {"rowid": 3, "code": "GC-1"},
    ),
    "not_null_missing": (
        {"statements": (), "declare": ("orders", "cancellation_reason   TEXT", "cancellation_reason   TEXT NOT NULL")},
        "orders",
        "not_null",
        {"rowid": 1001, "cancellation_reason": None},
    ),
    "foreign_key_orphan": (
        {"statements": ("UPDATE orders SET customer_id = 99 WHERE id = 1003",)},
        "orders",
        "foreign_key -> customers.id",
        {"rowid": 1003, "customer_id": 99},
    ),
    "check_set": (
        {"statements": ("UPDATE customers SET tier = 'platinum' WHERE id = 2",)},
        "customers",
        "check_in ['bronze', 'silver', 'gold']",
        {"rowid": 2, "tier": "platinum"},
    ),
    "check_range": (
        {"statements": ("UPDATE products SET stock = -5 WHERE id = 3",)},
        "products",
        "check_range [0, None]",
        {"rowid": 3, "stock": -5},
    ),
}


def test_clean_world_passes(golden):
    check = validate_world(golden.world)
    assert check.passed and check.details == []
    assert check.summary["tables"] == 9 and check.summary["expectations"] > 80


@pytest.mark.parametrize("defect", list(DEFECTS))
def test_planted_defect_is_caught_and_named(golden, defect):
    kwargs, table, check_name, offending = DEFECTS[defect]
    check = validate_world(plant(golden.world, *kwargs.get("statements", ()), declare=kwargs.get("declare")))
    assert not check.passed
    failures = [d for d in check.details if d["table"] == table and d["check"] == check_name]
    assert failures, check.details
    assert check.summary["failed"] == len(check.details)
    assert table in check.summary["reason"]
    if offending is not None:
        assert offending in failures[0]["offending"], failures[0]
    else:
        assert failures[0].get("unexpected_count", 1) >= 1 or failures[0].get("observed") == 0


def test_failing_gate_publishes_as_failed_with_the_report(golden, tmp_path):
    from worldsmith.storage.catalog import Catalog
    from worldsmith.storage.publish import version_record

    world = plant(golden.world, "UPDATE customers SET tier = 'platinum' WHERE id = 2")
    files = dict(golden.files, **{"world.db": world})
    from worldsmith.bundle.contract import artifact_digest

    defective = Bundle(
        manifest=golden.manifest.model_copy(
            update={"artifacts": {**golden.manifest.artifacts, "world.db": artifact_digest(world)}}
        ),
        files=files,
        tasks=golden.tasks,
        tools=golden.tools,
    )
    catalog = Catalog(f"sqlite:///{tmp_path / 'c.db'}")
    result = publish(defective, LocalStore(tmp_path / "store"), catalog, [validate_world(defective.world)])
    assert result.version.status == "failed"
    assert "expectations: 1 of" in result.version.failure_reason and "customers.tier" in result.version.failure_reason
    with catalog.session() as session:
        record = version_record(session, result.version)
    (report,) = record["reports"]
    assert report["kind"] == "expectations" and not report["passed"]
    assert report["details"][0]["offending"] == [{"rowid": 2, "tier": "platinum"}]
