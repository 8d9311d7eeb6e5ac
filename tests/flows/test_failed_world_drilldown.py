"""A failed world of a real `generate` run can be opened: from the dashboard's failed-worlds page to the
failing attempt's prompt, answer, files and diff in two clicks, and `catalog fetch` of it holds every file
its stages wrote, the failing attempt's output and a note saying which stage failed."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlmodel import select
from starlette.testclient import TestClient
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.dashboard.app import dashboard_app
from worldsmith.flows.generate import run_generate
from worldsmith.models.catalog import AttemptArtifact, StageAttempt
from worldsmith.models.generation import WorldOutcome
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore
from worldsmith.tasks.parameters import GenerateParameters

pytestmark = pytest.mark.flow

#: One world, every first attempt faulted (so repairs happen) and its seed fault surviving both attempts.
FAILING = GenerateParameters(
    count=1, seed=5, fault_rate=1.0, persistent_fault_rate=1.0, max_attempts=2, concurrency=1, min_good_share=0
)


@dataclass
class FailedRun:
    home: Path
    results: list[WorldOutcome]

    def catalog(self) -> Catalog:
        return Catalog(f"sqlite:///{self.home / 'catalog.db'}")

    def client(self) -> TestClient:
        return TestClient(dashboard_app(self.catalog(), store=LocalStore(self.home / "store")))


@pytest.fixture(scope="module")
def failed_run(prefect_api, tmp_path_factory: pytest.TempPathFactory) -> FailedRun:
    home = tmp_path_factory.mktemp("failed-world") / "home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLDSMITH_HOME", str(home))
        patch.setenv("WORLDSMITH_SANDBOX_WORKERS", "1")
        get_settings.cache_clear()
        results = run_generate(FAILING)
    get_settings.cache_clear()
    return FailedRun(home, results)


def link(html: str, css_class: str) -> str:
    """The href of the first link of class `css_class` on a page."""
    found = re.search(rf'<a class="{css_class}" href="([^"]+)"', html) or re.search(
        rf'<a id="{css_class}" href="([^"]+)"', html
    )
    assert found, f"no {css_class} link"
    return found.group(1)


def test_the_failing_prompt_and_answer_are_two_clicks_from_the_failed_worlds_page(failed_run):
    (outcome,) = failed_run.results
    assert (outcome.status, outcome.failed_stage) == ("failed", "database:seed")
    client = failed_run.client()
    assert 'href="/failed-worlds"' in client.get("/").text  # the front page's way in
    listing = client.get("/failed-worlds").text
    assert outcome.env_id in listing and "database:seed" in listing

    page = client.get(link(listing, "failing-attempt"))  # click 1: the failing attempt
    assert page.status_code == 200
    html = page.text
    assert "Attempt 2 of stage database:seed" in html
    assert "FOREIGN KEY constraint failed" in html  # the error
    assert 'data-role="system"' in html and 'data-role="user"' in html  # the prompt's messages as sent
    assert "Your previous answer was rejected" in html  # the repair's feedback, in the user message
    answer = re.search(r'<pre class="trace" id="answer-text">(.*?)</pre>', html, re.DOTALL)
    assert answer and "seed_sql" in answer.group(1)  # the model's raw answer
    assert 'data-file="seed.sql"' in html and "INSERT INTO" in html  # the file it wrote
    removed = re.findall(r'<span class="removed">(.*?)</span>', html)
    added = re.findall(r'<span class="added">(.*?)</span>', html)
    assert len(removed) == len(added) == 1 and removed[0] != added[0]  # the repair moved the dangling row
    assert "attempt 1/seed.sql" in html

    first = client.get(link(html, "previous-attempt")).text  # click 2: the attempt it repaired
    assert "Attempt 1 of stage database:seed" in first and 'data-key="diff"' not in first

    with failed_run.catalog().session() as session:
        attempts = session.exec(select(StageAttempt)).all()
        traced = {row.attempt_id for row in session.exec(select(AttemptArtifact)).all()}
    asked = [a for a in attempts if a.stage != "validate"]  # every attempt that asked the model kept its trace
    assert asked and all(a.id in traced for a in asked)


def test_catalog_fetch_of_the_failed_world_holds_its_stages_files_and_failing_attempt(failed_run, monkeypatch):
    (outcome,) = failed_run.results
    monkeypatch.setenv("WORLDSMITH_HOME", str(failed_run.home))
    get_settings.cache_clear()
    target = failed_run.home.parent / "fetched"
    fetched = CliRunner().invoke(app, ["catalog", "fetch", outcome.ref, str(target)])
    get_settings.cache_clear()
    assert fetched.exit_code == 0, fetched.output
    assert "FAILED.md says what failed" in fetched.output
    files = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    assert {"schema.sql", "work.json", "task_list.json", "FAILED.md"} <= files  # the stages before it
    assert "seed.sql" not in files  # no seed ever passed: its only copies are the failing attempt's
    assert {
        "failed_attempt/messages.json",
        "failed_attempt/answer.txt",
        "failed_attempt/seed.sql",
        "failed_attempt/error.txt",
    } <= files
    note = (target / "FAILED.md").read_text()
    assert "failed at stage database:seed" in note and "attempt 2" in note
    assert "FOREIGN KEY" in (target / "failed_attempt" / "error.txt").read_text()
    messages = json.loads((target / "failed_attempt" / "messages.json").read_text())
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "CREATE TABLE" in (target / "schema.sql").read_text()
