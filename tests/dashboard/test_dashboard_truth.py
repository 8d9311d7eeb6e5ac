"""The dashboard tells the truth: runs with their status and a page naming how each ended; the warning
that runs cannot start only for runs that are due, each problem once; stages in pipeline order, each in
one colour whatever the filters; filters picked from the catalog's values; the reward axis from zero."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from starlette.testclient import TestClient

from worldsmith.dashboard.app import dashboard_app
from worldsmith.dashboard.charts import all_charts, stage_colour, training_chart
from worldsmith.dashboard.data import generation_by_night, summary
from worldsmith.dashboard.filters import Filters
from worldsmith.models.catalog import Environment, EnvironmentVersion, RunRecord, StageAttempt
from worldsmith.models.runs import RunStatus
from worldsmith.storage.catalog import Catalog

NIGHT = datetime(2026, 11, 3, 2, 0, tzinfo=UTC)
#: (env, stage, outcome, backend, category): recorded out of pipeline order, tools:code before tools:spec.
WORLDS = [
    ("x", "tools:code", "success", "openai", "retail"),
    ("x", "verifiers", "failure", "openai", "retail"),
    ("x", "tools:spec", "success", "openai", "retail"),
    ("x", "tasks", "success", "openai", "retail"),
    ("y", "database:seed", "success", "procedural", "travel"),
    ("y", "database:schema", "success", "procedural", "travel"),
]
RUN = "9a7f0c4e-1d2b-4c3a-8e5f-6a7b8c9d0e1f"


@pytest.fixture()
def catalog(tmp_path) -> Catalog:
    """One night's attempts over two worlds of two backends and categories, the run's scenario attempt
    and record (failed later, in a world's stage: not the scenario stage)."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.session() as s:
        s.add(StageAttempt(run_id=RUN, env_id=None, stage="scenario", attempt=1, outcome="success", created_at=NIGHT))
        for i, (env, stage, outcome, _, _) in enumerate(WORLDS):
            s.add(
                StageAttempt(
                    run_id=RUN,
                    env_id=env,
                    stage=stage,
                    attempt=1,
                    outcome=outcome,
                    created_at=NIGHT + timedelta(minutes=i + 1),
                )
            )
        for env, _, _, backend, category in {w[0]: w for w in WORLDS}.values():
            s.add(Environment(env_id=env, scenario_name=env, categories=[category]))
            s.add(
                EnvironmentVersion(
                    env_id=env,
                    version=1,
                    content_key=f"k{env}",
                    manifest_digest=f"sha256:{env}",
                    generator_backend=backend,
                    created_at=NIGHT,
                )
            )
        s.add(
            RunRecord(
                run_id=RUN,
                kind="generate",
                what="2 worlds (mixed)",
                status=RunStatus.COMPLETED,
                flow_run_id=RUN,
                started_at=NIGHT,
                finished_at=NIGHT + timedelta(hours=1),
            )
        )
        s.commit()
    return catalog


@pytest.mark.unit
def test_stages_are_in_pipeline_order_each_in_its_own_colour_whatever_the_filter(catalog):
    with catalog.session() as s:
        everything = generation_by_night(s)
        retail = generation_by_night(s, Filters(category="retail"))
        data = summary(s)
    assert list(everything["stages"]) == [
        "scenario",
        "tasks",
        "database:schema",
        "database:seed",
        "tools:spec",
        "tools:code",
        "verifiers",
    ]
    assert list(retail["stages"]) == ["tasks", "tools:spec", "tools:code", "verifiers"]  # the world y left out
    chart = all_charts(data)["generation-first_attempt_success"]
    colours = {trace["name"]: trace["marker"]["color"] for trace in _traces(chart)}
    assert colours == {stage: stage_colour(stage) for stage in everything["stages"]}
    assert len(set(colours.values())) == len(colours)  # each stage its own
    with catalog.session() as s:
        filtered = all_charts(summary(s, Filters(category="retail")))["generation-cost"]
    assert {t["name"]: t["marker"]["color"] for t in _traces(filtered)} == {
        stage: colours[stage] for stage in retail["stages"]
    }
    assert stage_colour("someday:new") == stage_colour("someday:new")  # an unknown stage: still one colour


def _traces(chart_html: str) -> list[dict]:
    """The traces of a chart's HTML fragment (plotly's `Plotly.newPlot(id, traces, ...)`)."""
    data = re.search(r"Plotly\.newPlot\(\s*\"[^\"]+\",\s*(\[.*?\]),\s*\{", chart_html, re.S)
    assert data, chart_html[:300]
    return json.loads(data.group(1))


@pytest.mark.unit
def test_filters_offer_the_catalogs_runs_backends_and_categories(catalog):
    page = TestClient(dashboard_app(catalog)).get("/", params={"category": "travel"}).text
    selects = {
        name: re.findall(r'<option value="([^"]*)"', body)
        for name, body in re.findall(r'<select name="(\w+)">(.*?)</select>', page, re.S)
    }
    assert selects == {"run": ["", RUN], "backend": ["", "openai", "procedural"], "category": ["", "retail", "travel"]}
    assert '<option value="travel" selected>' in page and 'type="text"' not in page  # nothing to type


@pytest.mark.unit
def test_the_reward_axis_starts_at_zero():
    row = {"id": 1, "model": "tiny", "steps": [1, 2], "reward": [0.6, 0.8]}
    html = training_chart([row])["training"]
    axes = [json.JSONDecoder().raw_decode(html, m.end())[0] for m in re.finditer(r'"yaxis":', html)]
    [reward] = [axis for axis in axes if axis.get("title") == {"text": "mean reward"}]
    assert reward["rangemode"] == "tozero"  # 0.6 and 0.8 drawn from 0, not from 0.6


@pytest.mark.unit
def test_the_runs_page_and_a_run_that_died_in_the_scenario_stage(catalog):
    died = str(uuid.uuid4())
    with catalog.session() as s:
        s.add(StageAttempt(run_id=died, env_id=None, stage="scenario", attempt=1, outcome="success", created_at=NIGHT))
        s.add(
            RunRecord(
                run_id=died,
                kind="generate",
                what="1 worlds (openai)",
                status=RunStatus.FAILED,
                metrics={
                    "error": "the scenario stage failed, no world was built: 0 scenarios",
                    "failed_stage": "scenario",
                },
                started_at=NIGHT,
            )
        )
        s.commit()
    client = TestClient(dashboard_app(catalog))
    front = client.get("/").text
    assert f'data-run="{died}"' in front and f'data-run="{RUN}"' in front  # the latest runs, with their status
    failed = client.get("/runs", params={"status": "failed"}).text
    assert f'data-run="{died}"' in failed and f'data-run="{RUN}"' not in failed
    page = client.get(f"/runs/generate/{died}").text
    assert 'data-status="failed"' in page and "no world was built" in page and 'id="failed-stage"' in page
    stage = client.get(f"/nights/{NIGHT.date()}/stages/scenario").text
    rows = {run: body for run, body in re.findall(r'<tr data-run="([^"]+)">(.*?)</tr>', stage, re.S)}
    assert ">failed<" in rows[died] and ">succeeded<" in rows[RUN]  # the attempt succeeded, the run died there
    assert client.get("/runs/generate/no-such-run").status_code == 404
    assert client.get("/runs/nightly/x").status_code == 404 and client.get("/runs?status=lost").status_code == 400


@pytest.mark.flow
def test_the_banner_names_a_problem_once_and_only_for_runs_that_are_due(catalog, prefect_api):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context)
    from prefect.states import Scheduled

    idle = f"idle-{uuid.uuid4().hex[:6]}"
    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=idle, type="process"))
        flow_id = client.create_flow_from_name(f"train-{idle}")
        deployments = [client.create_deployment(flow_id, name, work_pool_name=idle) for name in ("a", "b", "c")]
    app = dashboard_app(catalog, prefect_api_url=PREFECT_API_URL.value())
    assert f"pool {idle} has no live worker" not in TestClient(app).get("/").text  # nothing asked to run there
    with get_client(sync_client=True) as client:
        later = datetime.now(UTC) + timedelta(days=1)
        client.create_flow_run_from_deployment(deployments[2], state=Scheduled(scheduled_time=later))  # not due
        for deployment in deployments[:2]:
            client.create_flow_run_from_deployment(deployment)  # due now
    page = TestClient(app).get("/").text
    assert page.count(f"pool {idle} has no live worker") == 1, page  # once, with both deployments named
    assert f'data-deployment="train-{idle}/a"' in page and f'data-deployment="train-{idle}/b"' in page
    assert f'data-deployment="train-{idle}/c"' not in page  # its run is tomorrow's
    assert 'id="stalled"' not in TestClient(dashboard_app(catalog)).get("/").text  # no Prefect to ask: nothing said
