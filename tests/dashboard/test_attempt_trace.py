"""The attempt page as a trace viewer: the prompt, the answer, the files with their diff against the attempt a
repair answered, the evidence, the note on a text stored cut; the failed-worlds page links the failing attempt."""

from __future__ import annotations

import re

import pytest
from starlette.testclient import TestClient

from worldsmith.dashboard.app import dashboard_app
from worldsmith.llm.backend import Prompt
from worldsmith.llm.looks import Look
from worldsmith.models.catalog import Environment, EnvironmentVersion
from worldsmith.models.specs import SchemaSpec
from worldsmith.stages.attempts import AttemptLog, AttemptTrace
from worldsmith.storage.attempt_artifacts import MAX_ARTIFACT_BYTES
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore

pytestmark = pytest.mark.unit

FIRST = "CREATE TABLE users (id INTEGER PRIMARY KEY);\nCREATE TABEL orders (id INTEGER PRIMARY KEY);\n"
SECOND = "CREATE TABLE users (id INTEGER PRIMARY KEY);\nCREATE TABLE orders (id INTEGER PRIMARY KEY);\n"


@pytest.fixture()
def traced(tmp_path) -> TestClient:
    """World `w` of run `r`: its schema failed (a typo), was repaired with a long answer, then its seed failed
    for good with evidence; an attempt of world `x` recorded no trace."""
    catalog, store = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}"), LocalStore(tmp_path / "store")
    log = AttemptLog("r", catalog, store)

    def ask(feedback: str | None) -> Prompt:
        return Prompt("schema", "You write SQLite schemas.", f"Write the schema.{feedback or ''}")

    log.record(
        env_id="w",
        stage="database:schema",
        attempt=1,
        outcome="failure",
        error_class="sql_error",
        error_text='near "TABEL": syntax error',
        trace=AttemptTrace(
            ask(None),
            '{"schema_sql": "..."}',
            SchemaSpec(schema_sql=FIRST),
            looks=[Look(kind="query_database", arguments={"sql": "SELECT 1"}, answer="1 rows", via="tool_call")],
        ),
    )
    long_answer = "x" * (MAX_ARTIFACT_BYTES + 10)
    log.record(
        env_id="w",
        stage="database:schema",
        attempt=2,
        outcome="success",
        trace=AttemptTrace(ask("\nYour previous answer was rejected."), long_answer, SchemaSpec(schema_sql=SECOND)),
    )
    log.record(
        env_id="w",
        stage="database:seed",
        attempt=1,
        outcome="failure",
        error_class="seed_error",
        error_text="FOREIGN KEY constraint failed",
        trace=AttemptTrace(evidence=[{"probe": "seed", "detail": "orders row 1: user_id=99 has no match"}]),
    )
    log.record(env_id="x", stage="tasks", attempt=1, outcome="failure", error_text="an older catalog's attempt")
    with catalog.session() as session:
        session.add(Environment(env_id="w", scenario_name="w"))
        session.flush()
        session.add(
            EnvironmentVersion(
                env_id="w",
                version=1,
                content_key="kw",
                manifest_digest="sha256:w",
                status="failed",
                failed_stage="database",
                failure_reason="stage database:seed failed after 1 attempts",
            )
        )
    return TestClient(dashboard_app(catalog, store=store))


def ids(client: TestClient) -> dict[tuple[str, int], int]:
    """The attempts' ids on world w's page, by (stage, attempt)."""
    html = client.get("/worlds/w").text
    rows = re.findall(r'<tr data-attempt="(\d+)">.*?<td class="text">([^<]+)</td><td>(\d+)</td>', html, re.DOTALL)
    return {(stage, int(number)): int(attempt_id) for attempt_id, stage, number in rows}


def test_a_repair_shows_its_prompt_answer_and_the_diff_of_its_files(traced):
    attempt = ids(traced)[("database:schema", 2)]
    html = traced.get(f"/attempts/{attempt}").text
    assert 'data-role="system"' in html and "You write SQLite schemas." in html
    assert "Your previous answer was rejected." in html  # the user message as sent
    assert re.findall(r'<span class="removed">(.*?)</span>', html) == ["-CREATE TABEL orders (id INTEGER PRIMARY KEY);"]
    assert re.findall(r'<span class="added">(.*?)</span>', html) == ["+CREATE TABLE orders (id INTEGER PRIMARY KEY);"]
    assert f"truncated at {MAX_ARTIFACT_BYTES} bytes of {MAX_ARTIFACT_BYTES + 10}" in html  # the long answer, cut
    assert f'href="/attempts/{ids(traced)[("database:schema", 1)]}"' in html  # the attempt it repaired


def test_a_first_attempt_shows_its_files_whole_and_a_check_its_evidence(traced):
    first = traced.get(f"/attempts/{ids(traced)[('database:schema', 1)]}").text
    assert 'data-file="schema.sql"' in first and "CREATE TABEL orders" in first and 'data-key="diff"' not in first
    assert 'id="looks"' in first and "SELECT 1" in first and "1 rows" in first  # what it looked at first
    seed = traced.get(f"/attempts/{ids(traced)[('database:seed', 1)]}").text
    assert 'id="evidence"' in seed and "user_id=99 has no match" in seed and 'id="prompt"' not in seed


def test_an_attempt_without_a_trace_says_so(traced):
    html = traced.get("/worlds/x").text
    (attempt,) = re.findall(r'<tr data-attempt="(\d+)">', html)
    assert 'id="no-trace"' in traced.get(f"/attempts/{attempt}").text


def test_the_failed_worlds_page_links_the_failing_attempt(traced):
    html = traced.get("/failed-worlds").text
    assert f'<a class="failing-attempt" href="/attempts/{ids(traced)[("database:seed", 1)]}">' in html
