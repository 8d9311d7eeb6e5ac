"""The seed-data quality gate: each kind of planted defect is caught and named with its rows,
and a failing gate publishes the version as failed."""

from __future__ import annotations

import sqlite3

import pytest

from worldsmith.bundle.contract import Bundle
from worldsmith.quality.expectations import validate_world
from worldsmith.storage.objectstore import LocalStore
from worldsmith.storage.publish import publish

pytestmark = pytest.mark.unit


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
def test_each_planted_defect_fails_the_check_that_names_it(golden, defect):
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


# -- the determinism probe: replays under another real clock and other random seeds -------------------

#: Tools whose results or writes leak the real time past the world's clock, or randomness, and what
#: the probe says differs first.
LEAKS = {
    "monotonic": ("import time\n\n\ndef leaky(conn):\n    return {'uptime_s': int(time.monotonic())}\n", "its result"),
    "uuid4": (
        "import uuid\n\n\ndef leaky(conn):\n"
        "    conn.execute(\"INSERT INTO store_settings (key, value) VALUES ('ref', ?)\", (uuid.uuid4().hex,))\n"
        "    return {'saved': True}\n",
        "the database after it",
    ),
    "random": ("import random\n\n\ndef leaky(conn):\n    return {'code': random.randint(1, 10**9)}\n", "its result"),
    # a world without a clock reads the real time, shifted by over a day in the second replay
    "real_date": (
        "from datetime import date\n\n\ndef leaky(conn):\n    return {'day': date.today().isoformat()}\n",
        "its result",
    ),
    "real_sql_timestamp": (
        "def leaky(conn):\n"
        "    conn.execute(\"INSERT INTO store_settings (key, value) VALUES ('at', CURRENT_TIMESTAMP)\")\n"
        "    return {'saved': True}\n",
        "the database after it",
    ),
}
#: Clock reads that answer the world's instant: replays agree.
FROZEN = (
    "import time\nfrom datetime import date, datetime\nfrom worldsmith.runtime import now\n\n\n"
    "def leaky(conn):\n"
    "    values = [datetime.now(), date.today(), time.time(), now(), time.strftime('%H:%M:%S')]\n"
    "    conn.execute(\"INSERT INTO store_settings (key, value) VALUES ('at', ?)\", (repr(values),))\n"
    "    conn.execute(\"INSERT INTO store_settings (key, value) VALUES ('sql_at', CURRENT_TIMESTAMP)\")\n"
    "    return {'at': str(values[0])}\n"
)


def with_step(bundle: Bundle, source: str, clock: str | None) -> Bundle:
    """The golden `bundle` with one task only (placing an order: its verifier ignores other tables),
    whose reference solution ends with a call of tool `leaky` (from `source`), its clock set to `clock`."""
    from support.bundles import with_tools

    extended = with_tools(bundle, source, ["leaky"])
    task = bundle.task("t02_place_and_pay")
    step = task.solution[0].model_copy(update={"tool": "leaky", "arguments": {}})
    task = task.model_copy(update={"solution": [*task.solution, step]})
    manifest = extended.manifest.model_copy(update={"clock": clock})
    return Bundle(manifest=manifest, files=extended.files, tasks=(task,), tools=extended.tools)


@pytest.fixture(scope="module")
def runtimes():
    from support.limits import ISOLATIONS, PATIENT_LIMITS, isolated

    from worldsmith.runtime.episode import Runtime

    made = {mode: Runtime(limits=isolated(PATIENT_LIMITS, mode), workers=1) for mode in ISOLATIONS}
    yield made
    for runtime in made.values():
        runtime.close()


def _determinism(runtime, bundle: Bundle):
    from worldsmith.quality.probe_results import Probe
    from worldsmith.quality.probes import probe_tasks

    results = probe_tasks(runtime, bundle)
    assert all(r.passed for r in results if r.probe != Probe.REPLAY_DETERMINISTIC), results
    (probe,) = [r for r in results if r.probe == Probe.REPLAY_DETERMINISTIC]
    return probe


@pytest.mark.sandbox
@pytest.mark.parametrize("isolation", ["strict", "fast"])
@pytest.mark.parametrize("leak", list(LEAKS))
def test_a_world_depending_on_the_real_clock_or_randomness_fails_the_probe_naming_the_tool(
    runtimes, golden, leak, isolation
):
    source, what = LEAKS[leak]
    bundle = with_step(golden, source, None if leak.startswith("real_") else "2024-05-06T10:11:12")
    probe = _determinism(runtimes[isolation], bundle)
    step = len(bundle.tasks[0].solution)
    assert not probe.passed and probe.target == bundle.tasks[0].id
    assert probe.detail.startswith(f"tool leaky (step {step}): {what} differs between two replays"), probe.detail


@pytest.mark.sandbox
@pytest.mark.parametrize("isolation", ["strict", "fast"])
def test_clock_reads_of_a_world_with_a_clock_pass_the_probe(runtimes, golden, isolation):
    probe = _determinism(runtimes[isolation], with_step(golden, FROZEN, "2024-05-06T10:11:12"))
    assert probe.passed, probe.detail


@pytest.mark.sandbox
def test_clean_worlds_pass_every_probe(runtimes, golden):
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.quality.probes import check_environment

    for bundle in (golden, procedural_bundle("clinic", 2)):
        failed = [r for r in check_environment(runtimes["strict"], bundle) if not r.passed]
        assert failed == [], failed
