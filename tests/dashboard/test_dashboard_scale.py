"""The dashboard at fleet size, checked cheaply: its sums come from rollups the database keeps as attempts are
recorded (equal to a recomputation from the attempts, on SQLite and PostgreSQL, also for a catalog upgraded
from before the rollups), no page reads the attempt table beyond an index lookup, and `/healthz` answers while
a page waits on the catalog. bench/scale.py measures the pages at 10,000 worlds."""

from __future__ import annotations

import json
import random
import re
import sqlite3
import threading
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import event, insert
from sqlmodel import select
from starlette.testclient import TestClient
from support.patience import MOMENTS_S

from worldsmith.dashboard import drilldown
from worldsmith.dashboard.app import dashboard_app
from worldsmith.dashboard.data import generation_by_night, generation_nights
from worldsmith.dashboard.filters import Filters
from worldsmith.dashboard.paging import MAX_PAGE_SIZE, PageRequest
from worldsmith.localserver import BackgroundServer
from worldsmith.models.catalog import (
    Environment,
    EnvironmentVersion,
    FailureRollup,
    NightFailureRollup,
    NightRollup,
    StageAttempt,
    StageRollup,
    WorldRollup,
)
from worldsmith.stages.attempts import AttemptLog
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.unit

STAGES = ("tasks", "database:schema", "tools:code", "validate", "environment")
#: Two nights and the minute around the midnight between them (a night is a UTC date).
START = datetime(2026, 11, 1, 23, 50, tzinfo=UTC)


def synthetic_attempts(worlds: int, per_world: int, seed: int = 7) -> list[dict]:
    """Stage attempts of `worlds` worlds over three runs and two nights: repair loops of 1-3 attempts, some
    failures without an error class, a run's scenario attempts of no world, the pseudo-stage `environment`."""
    rng = random.Random(seed)
    rows = []
    for w in range(worlds):
        env = None if w == 0 else f"w{w:03d}"
        moment = START + timedelta(seconds=rng.randint(0, 1200))
        while sum(1 for r in rows if r["env_id"] == env) < per_world:
            stage, tries = rng.choice(STAGES), rng.randint(1, 3)
            for attempt in range(1, tries + 1):
                ok = attempt == tries and rng.random() < 0.7
                moment += timedelta(seconds=rng.randint(1, 30))
                rows.append(
                    {
                        "run_id": f"run-{w % 3}",
                        "env_id": env,
                        "stage": stage,
                        "attempt": attempt,
                        "outcome": "success" if ok else rng.choice(("failure", "transient")),
                        "error_class": None if ok or rng.random() < 0.3 else rng.choice(("E1", "E2", "E3")),
                        "tokens_in": rng.randint(1, 500),
                        "tokens_out": rng.randint(1, 200),
                        "cost_usd": rng.randint(1, 1000) / 1e5,
                        "seconds": rng.randint(1, 100) / 10,
                        "created_at": moment,
                    }
                )
    return rows


def fill(catalog: Catalog, rows: list[dict]) -> None:
    """Record `rows` in one bulk insert, the worlds' environments, a version for every other world."""
    envs = sorted({r["env_id"] for r in rows if r["env_id"]})
    with catalog.session() as s:
        s.execute(insert(StageAttempt), rows)
        s.add_all(
            Environment(env_id=e, scenario_name=e, categories=["retail" if i % 2 else "travel"])
            for i, e in enumerate(envs)
        )
        s.flush()
        s.add_all(
            EnvironmentVersion(
                env_id=e,
                version=1,
                content_key=f"k-{e}",
                manifest_digest=f"sha256:{e}",
                status="good" if i % 4 else "failed",
                generator_backend="openai" if i % 3 else "procedural",
                created_at=START,
            )
            for i, e in enumerate(envs)
            if i % 2 == 0
        )


#: Each rollup's key; the world totals leave out the pseudo-stage `environment`.
SUMS_GRAINS = {
    StageRollup: ("night", "run_id", "env_id", "stage"),
    NightRollup: ("night", "run_id", "stage"),
    WorldRollup: ("env_id",),
}
FAILURE_GRAINS = {
    FailureRollup: ("night", "run_id", "env_id", "stage", "error_class"),
    NightFailureRollup: ("night", "run_id", "stage", "error_class"),
}
SUMS = ("attempts", "invocations", "first_ok", "repaired", "failures", "tokens_in", "tokens_out")


def key_of(attempt: StageAttempt, columns: tuple[str, ...]) -> tuple:
    def value(column: str):
        if column == "night":
            at = attempt.created_at
            return (at if at.tzinfo else at.replace(tzinfo=UTC)).astimezone(UTC).date()
        return getattr(attempt, column) or ""

    return tuple(value(c) for c in columns)


def assert_rollups_match_the_attempts(catalog: Catalog) -> None:
    """Every rollup holds what summing the attempts in Python gives."""
    with catalog.session() as s:
        attempts = s.exec(select(StageAttempt)).all()
        for table, key in SUMS_GRAINS.items():
            expected: dict[tuple, list] = defaultdict(lambda: [0] * 9)
            for a in attempts:
                if table is WorldRollup and a.stage == "environment":
                    continue
                ok = a.outcome == "success"
                sums = expected[key_of(a, key)]
                flags = (1, a.attempt == 1, a.attempt == 1 and ok, a.attempt > 1 and ok, not ok)
                for i, value in enumerate((*flags, a.tokens_in, a.tokens_out, a.cost_usd, a.seconds)):
                    sums[i] += value
            rows = {tuple(getattr(r, c) for c in key): r for r in s.exec(select(table)).all()}
            assert rows.keys() == expected.keys(), table.__name__
            for k, r in rows.items():
                assert [getattr(r, c) for c in SUMS] == expected[k][:7], (table.__name__, k)
                assert (r.cost_usd, r.seconds) == pytest.approx(tuple(expected[k][7:]))
        for table, key in FAILURE_GRAINS.items():
            counted: dict[tuple, int] = defaultdict(int)
            for a in attempts:
                if a.outcome != "success":
                    counted[key_of(a, key)] += 1
            found = {tuple(getattr(r, c) for c in key): r.failures for r in s.exec(select(table)).all()}
            assert found == dict(counted), table.__name__


def test_every_rollup_equals_a_recomputation_from_the_attempts(catalog):
    rows = synthetic_attempts(worlds=24, per_world=40)
    fill(catalog, rows)
    log = AttemptLog("live-run", catalog)  # the generation flow's own recording path, one attempt at a time
    log.record(env_id="w001", stage="tasks", attempt=1, outcome="failure", error_class="E9")
    log.record(env_id="w001", stage="tasks", attempt=2, outcome="success")
    assert_rollups_match_the_attempts(catalog)

    with catalog.session() as s:
        attempts = s.exec(select(StageAttempt)).all()
        by_night = generation_by_night(s)
        nights = {n["night"]: n for n in generation_nights(s)}
        worlds = drilldown.worlds_page(s, Filters(), PageRequest(limit=MAX_PAGE_SIZE))
        night = START.date()
        stages = {row["stage"]: row for row in drilldown.night_stages(s, night, Filters())}
        narrowed = generation_by_night(s, Filters(run="run-1", date_to=night))
        by_category = generation_by_night(s, Filters(category="retail"))  # the per-world rollups answer
        retail = {e.env_id for e in s.exec(select(Environment)).all() if "retail" in e.categories}
    real = [a for a in attempts if a.stage != "environment"]

    def night_of(a: StageAttempt) -> str:
        return (a.created_at if a.created_at.tzinfo else a.created_at.replace(tzinfo=UTC)).date().isoformat()

    assert by_night["nights"] == sorted({night_of(a) for a in real})
    for stage, series in by_night["stages"].items():
        for i, day in enumerate(by_night["nights"]):
            ran = [a for a in real if a.stage == stage and night_of(a) == day]
            first = [a for a in ran if a.attempt == 1]
            assert series["invocations"][i] == (len(first) if ran else None)
            assert series["attempts"][i] == (len(ran) if ran else None)
            assert series["tokens_in"][i] == (sum(a.tokens_in for a in ran) if ran else None)
            if first:
                ok = sum(1 for a in first if a.outcome == "success") / len(first)
                assert series["first_attempt_success"][i] == round(ok, 3)
    for day, row in nights.items():
        ran = [a for a in real if night_of(a) == day]
        assert row["attempts"] == len(ran) and row["runs"] == len({a.run_id for a in ran})
        assert row["worlds"] == len({a.env_id for a in ran if a.env_id})
    assert {w["env_id"]: w["attempts"] for w in worlds.rows} == {
        env: sum(1 for a in real if a.env_id == env) for env in {a.env_id for a in real if a.env_id}
    }
    for stage, row in stages.items():
        failed = [a for a in real if a.stage == stage and night_of(a) == night.isoformat() and a.outcome != "success"]
        assert row["failed_attempts"] == len(failed) == sum(row["failure_classes"].values())
    assert narrowed["nights"] == [night.isoformat()]
    only = [a for a in real if a.run_id == "run-1" and night_of(a) == night.isoformat()]
    assert sum(sum(v or 0 for v in s["attempts"]) for s in narrowed["stages"].values()) == len(only)
    in_retail = [a for a in real if a.env_id in retail]
    assert sum(sum(v or 0 for v in s["attempts"]) for s in by_category["stages"].values()) == len(in_retail)


def test_an_older_catalog_gets_its_rollups_on_upgrade(tmp_path):
    from alembic import command

    from worldsmith.storage.catalog import alembic_config

    url = f"sqlite:///{tmp_path / 'old.db'}"
    old = Catalog(url)
    with old.engine.begin() as connection:  # back to the schema before the rollups, then attempts recorded
        config = alembic_config(url)
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    with old.engine.begin() as connection:
        connection.execute(insert(StageAttempt.__table__), synthetic_attempts(worlds=10, per_world=30))
    old.close()
    upgraded = Catalog(url)
    assert upgraded.revision() == Catalog.head()
    assert_rollups_match_the_attempts(upgraded)
    upgraded.close()


def scans_of_attempts(catalog: Catalog, paths: list[str]) -> tuple[list[str], int]:
    """Serve `paths`; the query plans (SQLite) of every statement they ran that read `stage_attempts` other
    than through an index, and how many StageAttempt objects they loaded."""
    statements: list[tuple[str, object]] = []
    loaded = [0]

    def record(conn, cursor, statement, parameters, context, executemany):
        if not executemany:
            statements.append((statement, parameters))

    def count(target, context):
        loaded[0] += 1

    event.listen(catalog.engine, "before_cursor_execute", record)
    event.listen(StageAttempt, "load", count)
    try:
        client = TestClient(dashboard_app(catalog))
        for path in paths:
            assert client.get(path).status_code == 200, path
    finally:
        event.remove(catalog.engine, "before_cursor_execute", record)
        event.remove(StageAttempt, "load", count)
    scans = []
    with catalog.engine.connect() as conn:
        for statement, parameters in statements:
            plan = conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {statement}", parameters).all()
            details = [row[-1] for row in plan]
            if any(re.match(r"SCAN stage_attempts\b", d) for d in details):
                scans.append(f"{statement}\n  {details}")
    return scans, loaded[0]


def test_no_page_reads_every_attempt(tmp_path):
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    fill(catalog, synthetic_attempts(worlds=30, per_world=100))
    with catalog.session() as s:
        attempt_id = s.exec(select(StageAttempt.id).where(StageAttempt.env_id == "w002")).first()
    night = START.date().isoformat()
    paths = [
        "/",
        "/?category=retail&backend=openai",
        "/api/summary",
        f"/api/summary?run=run-1&date_from={night}",
        f"/nights/{night}",
        f"/nights/{night}/stages/tasks",
        f"/nights/{night}/stages/tasks?error_class=unclassified",
        "/worlds?status=unpublished",
        "/failed-worlds",
        "/worlds/w002",
        f"/attempts/{attempt_id}",
    ]
    scans, loaded = scans_of_attempts(catalog, paths)
    assert scans == [], "\n".join(scans)
    # the world page shows one page of its attempts and the attempt page one: never every attempt
    assert 0 < loaded <= 100 + 1
    catalog.close()


def test_healthz_answers_while_a_page_waits_on_the_catalog(tmp_path):
    path = tmp_path / "catalog.db"
    catalog = Catalog(f"sqlite:///{path}")
    fill(catalog, synthetic_attempts(worlds=4, per_world=10))
    catalog.engine.dispose()  # no open connection: the page's first query connects, and waits
    asked = threading.Event()
    event.listen(catalog.engine, "do_connect", lambda *args: asked.set())
    # another process's writer holds the database: the page's first query waits for it
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    answers: dict[str, httpx.Response] = {}
    with BackgroundServer(dashboard_app(catalog)) as server:
        page = threading.Thread(target=lambda: answers.update(page=httpx.get(f"{server.url}/", timeout=MOMENTS_S)))
        page.start()
        try:
            assert asked.wait(MOMENTS_S)  # the page is in its first query, blocked
            health = httpx.get(f"{server.url}/healthz", timeout=MOMENTS_S)
            assert health.text == "ok" and page.is_alive() and "page" not in answers
        finally:
            holder.execute("ROLLBACK")
            holder.close()
            page.join(MOMENTS_S)
    assert answers["page"].status_code == 200
    catalog.close()


#: Environment versions in the catalog of the CLI's listing tests: every fifth one failed.
MANY_WORLDS = 250


@pytest.fixture()
def many_versions(home) -> None:
    """MANY_WORLDS environment versions in the home's catalog, w000@1 to w249@1, every fifth failed."""
    from worldsmith.storage.catalog import open_catalog

    worlds = MANY_WORLDS
    with open_catalog().session() as s:
        s.execute(
            insert(Environment),
            [{"env_id": f"w{i:03d}", "scenario_name": "s", "categories": []} for i in range(worlds)],
        )
        s.execute(
            insert(EnvironmentVersion),
            [
                {
                    "env_id": f"w{i:03d}",
                    "version": 1,
                    "content_key": f"k{i}",
                    "manifest_digest": f"sha256:{i}",
                    "status": "failed" if i % 5 == 0 else "good",
                    "stats": {"tasks": 3},
                    "quality": {},
                }
                for i in range(worlds)
            ],
        )


def _cli(*args: str) -> str:
    from typer.testing import CliRunner

    from worldsmith.cli import app

    result = CliRunner().invoke(app, list(args))
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.usefixtures("tables_at_a_fixed_width")
def test_catalog_ls_lists_one_page_of_many_versions(many_versions):
    first = _cli("catalog", "ls")
    assert "250 environment versions, 1-100 shown" in first and "150 more: --offset 100" in first
    assert "w099@1" in first and "w100@1" not in first
    last = _cli("catalog", "ls", "--offset", "200")
    assert "w200@1" in last and "w199@1" not in last and "more:" not in last
    assert len(json.loads(_cli("catalog", "ls", "--json"))) == MANY_WORLDS  # JSON: every row unless --limit
    failed = json.loads(_cli("catalog", "ls", "--status", "failed", "--json", "--limit", "7", "--offset", "3"))
    assert [r["ref"] for r in failed] == [f"w{i:03d}@1" for i in range(15, 50, 5)]


@pytest.mark.usefixtures("tables_at_a_fixed_width")
def test_sets_create_counts_its_members_in_sql(many_versions):
    made = _cli("sets", "create", "all-good", "--validation-fraction", "0.1")
    assert "created set all-good: 200 environment versions (180 train, 20 validation)" in made
