"""The dashboard: its numbers for a known catalog, over HTTP, and as a browser renders them."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, timedelta

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import Select, WebDriverWait
from starlette.testclient import TestClient
from support.patience import MOMENTS_S, PROCESS_S

from worldsmith.dashboard import drilldown
from worldsmith.dashboard.app import dashboard_app, flow_run_url
from worldsmith.dashboard.charts import all_charts, value_axis
from worldsmith.dashboard.data import generation_nights, summary
from worldsmith.dashboard.filters import Filters
from worldsmith.dashboard.paging import PageRequest
from worldsmith.localserver import BackgroundServer
from worldsmith.models.catalog import (
    Environment,
    EnvironmentSet,
    EnvironmentSetMember,
    EnvironmentVersion,
    EvaluationRun,
    QualityReport,
    StageAttempt,
    TrainingRun,
    TrainingStep,
)
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.unit

NIGHT_1, NIGHT_2 = datetime(2026, 11, 1, 2, 5, tzinfo=UTC), datetime(2026, 11, 2, 2, 7, tzinfo=UTC)

#: (night, env, stage, attempt, outcome): env a repairs its schema; b never gets its tasks right; c repairs its tasks.
ATTEMPTS = [
    (NIGHT_1, "a", "database:schema", 1, "failure"),
    (NIGHT_1, "a", "database:schema", 2, "success"),
    (NIGHT_1, "a", "tasks", 1, "success"),
    (NIGHT_1, "b", "database:schema", 1, "success"),
    (NIGHT_1, "b", "tasks", 1, "failure"),
    (NIGHT_1, "b", "tasks", 2, "failure"),
    (NIGHT_2, "c", "database:schema", 1, "success"),
    (NIGHT_2, "c", "tasks", 1, "failure"),
    (NIGHT_2, "c", "tasks", 2, "success"),
]


#: The error class and text of each failed attempt in ATTEMPTS (world c's tasks failure recorded no class).
ERRORS = {
    ("a", "database:schema", 1): ("SchemaError", 'near "CREAT": syntax error\n' + "line 3 " * 40),
    ("b", "tasks", 1): ("TaskFormatError", "task t02 has no expected outcome"),
    ("b", "tasks", 2): ("TaskFormatError", "task t02 has no expected outcome (again)"),
    ("c", "tasks", 1): (None, "the model answered with prose"),
}
#: Night 1's run ran outside Prefect; night 2's is a Prefect flow run (its id a UUID).
RUNS = {NIGHT_1: "run-1", NIGHT_2: "5b0c3a1e-8d4f-4c59-9a51-0e0c2f5d7b11"}

CRASH = "crashed: Flow run infrastructure exited with non-zero status code -9."

#: An older catalog's record of world b failing: the pseudo-stage "environment" (not a stage, no tokens).
LEGACY_FAILURE = (NIGHT_1, "b", "environment", 1, "failure")


def usage(attempt: int) -> dict[str, float]:
    """The tokens and cost the known catalog records for an attempt (more for later attempts)."""
    return {"tokens_in": 100 * attempt, "tokens_out": 40, "cost_usd": 0.01 * attempt, "seconds": 1.5 * attempt}


def usage_of(rows, seconds: bool = False) -> dict[str, float]:
    """Attempts, tokens and cost (and seconds, with `seconds`) of `rows` (entries of ATTEMPTS), as the dashboard
    sums them."""
    used = [usage(row[3]) for row in rows]
    total = {
        "attempts": len(used),
        "tokens_in": sum(u["tokens_in"] for u in used),
        "tokens_out": sum(u["tokens_out"] for u in used),
        "cost_usd": round(sum(u["cost_usd"] for u in used), 6),
    }
    return {**total, "seconds": round(sum(u["seconds"] for u in used), 3)} if seconds else total


@pytest.fixture()
def known(tmp_path) -> Catalog:
    """A catalog holding a known set of runs: two generation nights, quality reports, a set, two
    evaluations, a three-step training run, a co-training run and a training run that crashed."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.session() as s:
        for night, env, stage, attempt, outcome in [*ATTEMPTS, LEGACY_FAILURE]:
            error_class, error_text = ERRORS.get((env, stage, attempt), (None, None))
            s.add(
                StageAttempt(
                    run_id=RUNS[night],
                    env_id=env,
                    stage=stage,
                    attempt=attempt,
                    outcome=outcome,
                    error_class=error_class,
                    error_text=error_text,
                    **(usage(attempt) if stage != "environment" else {}),
                    created_at=night + timedelta(minutes=attempt),
                )
            )
        for env, category in (("a", "retail"), ("c", "travel")):
            s.add(Environment(env_id=env, scenario_name=env, categories=[category]))
        a = EnvironmentVersion(
            env_id="a",
            version=1,
            content_key="ka",
            manifest_digest="sha256:a",
            status="good",
            generator_backend="procedural",
            generator_model="procedural-v1",
            created_at=NIGHT_1,
        )
        c = EnvironmentVersion(
            env_id="c",
            version=1,
            content_key="kc",
            manifest_digest="sha256:c",
            status="failed",
            failed_stage="validate",
            failure_reason="probes: t01 passes on the untouched database",
            generator_backend="openai",
            generator_model="big-model",
            created_at=NIGHT_2,
        )
        s.add_all([a, c])
        s.flush()
        s.add_all(
            [
                QualityReport(version_id=a.id, kind="expectations", passed=True),
                QualityReport(version_id=a.id, kind="probes", passed=True),
                QualityReport(version_id=c.id, kind="expectations", passed=True),
                QualityReport(version_id=c.id, kind="probes", passed=False),
            ]
        )
        env_set = EnvironmentSet(name="nightly")
        s.add(env_set)
        s.flush()
        s.add_all(
            [
                EnvironmentSetMember(set_id=env_set.id, version_id=a.id, split="train"),
                EnvironmentSetMember(set_id=env_set.id, version_id=c.id, split="validation"),
            ]
        )
        s.add(
            EvaluationRun(
                set_id=env_set.id,
                policy="reference",
                samples=1,
                status="completed",
                metrics={  # a record stored before agent errors were counted
                    "overall": {
                        "episodes": 10,
                        "tasks": 10,
                        "pass@1": 1.0,
                        "mean_reward": 1.0,
                        "mean_turns": 3.0,
                        "env_error_rate": 0.0,
                        "format_error_rate": 0.0,
                    }
                },
            )
        )
        s.add(
            EvaluationRun(
                set_id=env_set.id,
                policy="random",
                samples=4,
                status="completed",
                metrics={
                    "overall": {
                        "pass@1": 0.25,
                        "pass@4": 0.5,
                        "episodes": 40,
                        "tasks": 10,
                        "mean_reward": 0.3,
                        "mean_turns": 5.0,
                        "env_error_rate": 0.1,
                        "format_error_rate": 0.2,
                        "agent_error_rate": 0.05,
                    }
                },
            )
        )
        run = TrainingRun(set_id=env_set.id, config={"model": "tiny"}, status="completed")
        s.add(run)
        s.flush()
        for step, reward in ((1, 0.1), (2, 0.3), (3, 0.5)):
            s.add(
                TrainingStep(
                    training_run_id=run.id,
                    step=step,
                    metrics={"reward": reward, "success_rate": reward / 2, "loss": 1.0 / step},
                )
            )
        cotrain = TrainingRun(
            set_id=env_set.id, config={"kind": "cotrain", "policy": {"model": "tiny"}}, status="completed"
        )
        s.add(cotrain)
        s.flush()
        for number, real, pass1, accuracy in ((1, 0.5, 0.5, None), (2, 0.75, 1.0, 0.25)):
            s.add(
                TrainingStep(
                    training_run_id=cotrain.id,
                    step=number,
                    metrics={
                        "real_success_rate": real,
                        "eval_pass@1": pass1,
                        "imagined_rate": 0.75,
                        "stopped_rate": 0.125,
                        "wm_loss": 2.0 / number,
                        **({"wm_accuracy_fresh": accuracy} if accuracy is not None else {}),
                    },
                )
            )
        crashed = TrainingRun(set_id=env_set.id, config={"model": "tiny"}, status="failed", metrics={"error": CRASH})
        s.add(crashed)
        s.flush()
        s.add(
            TrainingStep(training_run_id=crashed.id, step=1, metrics={"reward": 0.2, "success_rate": 0.1, "loss": 0.9})
        )
    yield catalog
    catalog.close()


EXPECTED_RATES = {
    "database:schema": {
        "first_attempt_success": [0.5, 1.0],
        "repair_rate": [0.5, 0.0],
        "failure_rate": [0.0, 0.0],
        "invocations": [2, 1],
    },
    "tasks": {
        "first_attempt_success": [0.5, 0.0],
        "repair_rate": [0.0, 1.0],
        "failure_rate": [0.5, 0.0],
        "invocations": [2, 1],
    },
}


def _stage_usage(stage: str) -> dict[str, list]:
    """Per night, the attempts, tokens and cost of `stage` in ATTEMPTS."""
    per_night = [usage_of([a for a in ATTEMPTS if a[0] == night and a[2] == stage]) for night in (NIGHT_1, NIGHT_2)]
    return {key: [u[key] for u in per_night] for key in ("attempts", "tokens_in", "tokens_out", "cost_usd")}


EXPECTED_GENERATION = {
    "nights": ["2026-11-01", "2026-11-02"],
    "stages": {stage: {**rates, **_stage_usage(stage)} for stage, rates in EXPECTED_RATES.items()},
}


def test_summary_holds_the_catalogs_numbers(known):
    with known.session() as session:
        data = summary(session)
    assert data["generation"] == EXPECTED_GENERATION  # the pseudo-stage "environment" is left out
    night_1 = [a for a in ATTEMPTS if a[0] == NIGHT_1]
    assert data["nights"] == [
        {
            "night": "2026-11-01",
            "backend": "procedural:procedural-v1",
            "runs": 1,
            "worlds": 2,
            **usage_of(night_1),
            "good": 1,
            "failed": 1,  # world b, recorded the old way
        },
        {
            "night": "2026-11-02",
            "backend": "openai:big-model",
            "runs": 1,
            "worlds": 1,
            **usage_of([a for a in ATTEMPTS if a[0] == NIGHT_2]),
            "good": 0,
            "failed": 1,  # world c, published as failed
        },
    ]
    worlds = data["environments"]
    assert sum(n["tokens_in"] for n in data["nights"]) == sum(e["tokens_in"] for e in worlds)
    failed_reason = {
        "a": (None, None),
        "b": (None, None),
        "c": ("validate", "probes: t01 passes on the untouched database"),
    }
    assert worlds == [
        {
            "env_id": env,
            "status": status,
            "failed_stage": failed_reason[env][0],
            "failure_reason": failed_reason[env][1],
            **usage_of([a for a in ATTEMPTS if a[1] == env], seconds=True),
        }
        for env, status in (("a", "good"), ("b", "unpublished"), ("c", "failed"))  # equal cost: by env_id
    ]
    assert data["environments_total"] == 3 and data["failed_worlds_total"] == 1
    assert [(w["env_id"], w["failed_stage"]) for w in data["failed_worlds"]] == [("c", "validate")]
    assert data["failure_classes"] == {
        "nights": ["2026-11-01", "2026-11-02"],
        "series": {
            "tasks: TaskFormatError": [2, 0],
            "tasks: unclassified": [0, 1],
            "database:schema: SchemaError": [1, 0],
        },
    }
    assert list(data["failure_classes"]["series"])[-1].startswith("database")  # pipeline order: tasks first
    assert data["quality"] == {
        "versions": {"failed": 1, "good": 1},
        "checks": {"expectations": {"passed": 2, "failed": 0}, "probes": {"passed": 1, "failed": 1}},
        "failure_reasons": {"probes": 1},
    }
    assert [(s["name"], s["members"], s["train"], s["validation"]) for s in data["sets"]] == [("nightly", 2, 1, 1)]
    assert [
        (e["policy"], e["samples"], e["pass@1"], e["pass@k"], e["env_error_rate"], e["agent_error_rate"])
        for e in data["evaluations"]
    ] == [("reference", 1, 1.0, 1.0, 0.0, None), ("random", 4, 0.25, 0.5, 0.1, 0.05)]
    run, crashed = data["training"]
    assert (run["status"], run["error"], crashed["id"], crashed["status"], crashed["error"]) == (
        "completed",
        None,
        3,
        "failed",
        CRASH,
    )
    assert run["steps"] == [1, 2, 3] and run["reward"] == [0.1, 0.3, 0.5] and run["success_rate"] == [0.05, 0.15, 0.25]
    assert run["kind"] == "grpo" and [e["world"] for e in data["evaluations"]] == ["real", "real"]
    (cotrain,) = data["cotraining"]
    assert (cotrain["id"], cotrain["kind"], cotrain["model"], cotrain["steps"]) == (2, "cotrain", "tiny", [1, 2])
    assert cotrain["real_success_rate"] == [0.5, 0.75] and cotrain["eval_pass@1"] == [0.5, 1.0]
    assert (
        cotrain["wm_accuracy_fresh"] == [None, 0.25]
        and cotrain["wm_loss"] == [2.0, 1.0]
        and cotrain["stopped_rate"] == [0.125, 0.125]
    )


def test_an_empty_catalog_renders_a_page_saying_nothing_ran_yet(tmp_path):
    empty = Catalog(f"sqlite:///{tmp_path / 'empty.db'}")
    page = TestClient(dashboard_app(empty)).get("/")
    assert page.status_code == 200 and "No generation runs yet." in page.text and "No training runs yet." in page.text
    assert "No co-training runs yet." in page.text


def test_the_page_draws_every_chart_of_the_summary_the_api_serves(known):
    client = TestClient(dashboard_app(known, prefect_ui_url="http://127.0.0.1:4200"))
    with known.session() as session:
        assert client.get("/api/summary").json() == json.loads(json.dumps(summary(session)))
    html = client.get("/").text
    for chart in (
        "generation-first_attempt_success",
        "generation-repair_rate",
        "generation-failure_rate",
        "generation-cost",
        "generation-tokens",
        "failure-classes",
        "env-cost",
        "env-tokens",
        "quality",
        "evaluations",
        "training",
        "cotraining",
    ):
        assert f'id="chart-{chart}"' in html
    assert 'href="http://127.0.0.1:4200"' in html
    assert client.get("/static/plotly.min.js").status_code == 200 and client.get("/healthz").text == "ok"


def summary_of(catalog: Catalog, filters: Filters = Filters()) -> dict:
    with catalog.session() as session:
        return summary(session, filters)


@pytest.mark.sandbox
def test_browser_renders_the_charts_with_the_catalogs_numbers(known, browser):
    with BackgroundServer(dashboard_app(known)) as server:
        assert httpx.get(f"{server.url}/healthz", timeout=MOMENTS_S).text == "ok"
        browser.get(server.url)
        WebDriverWait(browser, PROCESS_S).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#chart-training .main-svg"))
        )
        charts = browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        assert len(charts) == 12 and all(c.find_elements(By.CSS_SELECTOR, ".main-svg") for c in charts)

        def traces(chart: str) -> dict:
            return browser.execute_script(
                f"return Object.fromEntries(document.getElementById('chart-{chart}').data.map(t => [t.name, t.y]))"
            )

        for rate in ("first_attempt_success", "repair_rate", "failure_rate"):
            assert traces(f"generation-{rate}") == {
                stage: series[rate] for stage, series in EXPECTED_GENERATION["stages"].items()
            }
        assert traces("generation-cost") == {
            stage: series["cost_usd"] for stage, series in EXPECTED_GENERATION["stages"].items()
        }
        assert traces("evaluations") == {
            "pass@1": [1.0, 0.25],
            "env_error rate": [0.0, 0.1],
            "format_error rate": [0.0, 0.2],
            "agent_error rate": [None, 0.05],
        }
        assert traces("failure-classes") == summary_of(known)["failure_classes"]["series"]
        assert traces("training") == {"run 1 (tiny)": [0.1, 0.3, 0.5], "run 3 (tiny)": [0.2]}
        assert traces("quality") == {"passed": [2, 1], "failed": [0, 1]}
        assert traces("cotraining") == {
            "run 2: real success": [0.5, 0.75],
            "run 2: eval pass@1": [0.5, 1.0],
            "run 2: world model accuracy": [None, 0.25],
        }
        # the drawn bars are there: one path per (trace, point) of the quality chart
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-quality .bars .point")) == 4

        def cell(table: str, row: str, key: str) -> str:
            return browser.find_element(By.CSS_SELECTOR, f"#table-{table} tr{row} td[data-key='{key}']").text

        assert cell("generation", "[data-night='2026-11-01'][data-stage='tasks']", "failure_rate") == "0.500"
        assert cell("generation", "[data-night='2026-11-02'][data-stage='tasks']", "repair_rate") == "1.000"
        assert cell("nights", "[data-night='2026-11-02']", "backend") == "openai:big-model"
        assert cell("nights", "[data-night='2026-11-01']", "failed") == "1"
        assert cell("generation", "[data-night='2026-11-01'][data-stage='tasks']", "tokens_in") == "400"
        assert cell("environments", "[data-env='b']", "status") == "unpublished"
        assert cell("environments", "[data-env='a']", "tokens_in") == "400"
        assert cell("evaluations", "[data-run='2']", "pass@k") == "0.500"
        assert cell("evaluations", "[data-run='2']", "format_error_rate") == "0.200"
        assert cell("training", "[data-run='1']", "reward") == "0.500"
        assert (
            cell("training", "[data-run='3']", "status") == "failed"
            and cell("training", "[data-run='3']", "error") == CRASH
        )
        assert (
            cell("training", "[data-run='1']", "error") == "" and cell("evaluations", "[data-run='1']", "error") == ""
        )
        assert cell("cotraining", "[data-run='2'][data-round='2']", "wm_accuracy_fresh") == "0.250"
        assert cell("cotraining", "[data-run='2'][data-round='1']", "wm_accuracy_fresh") == ""
        assert cell("cotraining", "[data-run='2'][data-round='1']", "stopped_rate") == "0.125"
        assert cell("sets", "[data-set='nightly']", "validation") == "1"


def failures_of(rows) -> int:
    return sum(1 for row in rows if row[4] != "success")


def test_a_nights_runs_are_listed_with_their_usage(known):
    with known.session() as session:
        runs = drilldown.night_runs(session, NIGHT_1.date(), Filters(), PageRequest())
        (prefect_run,) = drilldown.night_runs(session, NIGHT_2.date(), Filters(), PageRequest()).rows
    night_1 = [a for a in ATTEMPTS if a[0] == NIGHT_1]
    (run,) = runs.rows
    assert runs.total == 1 and run["run_id"] == RUNS[NIGHT_1] and run["flow_run_id"] is None and run["worlds"] == 2
    assert {key: run[key] for key in usage_of(night_1, seconds=True)} == usage_of(night_1, seconds=True)
    assert run["failed_attempts"] == failures_of(night_1)  # the pseudo-stage "environment" left out
    assert prefect_run["flow_run_id"] == RUNS[NIGHT_2]


def test_a_nights_stages_are_listed_in_pipeline_order_with_their_failure_classes(known):
    with known.session() as session:
        stages = drilldown.night_stages(session, NIGHT_1.date(), Filters())
        stages_2 = drilldown.night_stages(session, NIGHT_2.date(), Filters())
    assert [s["stage"] for s in stages] == ["tasks", "database:schema"]  # pipeline order, not alphabetical
    tasks, schema = stages
    assert (tasks["invocations"], tasks["first_attempt_success"], tasks["repaired"], tasks["failed_attempts"]) == (
        2,
        1,
        0,
        2,
    )
    assert tasks["failure_classes"] == {"TaskFormatError": 2} and schema["failure_classes"] == {"SchemaError": 1}
    assert (schema["repaired"], schema["worlds"]) == (1, 2)
    assert stages_2[0]["failure_classes"] == {drilldown.UNCLASSIFIED: 1}


def test_a_stages_worlds_are_listed_the_unsuccessful_first(known):
    with known.session() as session:
        tasks = drilldown.stage_worlds(session, NIGHT_1.date(), "tasks", Filters(), PageRequest())
        classed = drilldown.stage_worlds(
            session, NIGHT_1.date(), "database:schema", Filters(), PageRequest(), error_class="SchemaError"
        )
    # b never got its tasks right: listed first; a's tasks succeeded at once
    assert [(w["env_id"], w["succeeded"], w["status"]) for w in tasks.rows] == [
        ("b", False, "unpublished"),
        ("a", True, "good"),
    ]
    assert tasks.rows[0]["failure_classes"] == {"TaskFormatError": 2} and tasks.rows[1]["failure_classes"] == {}
    assert [w["env_id"] for w in classed.rows] == ["a"] and classed.total == 1


def test_a_worlds_versions_say_why_each_failed(known):
    with known.session() as session:
        versions = drilldown.world_versions(session, "c")
    assert versions == [
        {
            "env_id": "c",
            "version": 1,
            "status": "failed",
            "failed_stage": "validate",
            "failure_reason": "probes: t01 passes on the untouched database",
            "backend": "openai",
            "model": "big-model",
            "created_at": NIGHT_2.isoformat(),
        }
    ]


def test_a_worlds_attempts_page_by_stage_down_to_one_attempts_error(known):
    with known.session() as session:
        attempts = drilldown.world_attempts(session, "a", PageRequest())
        second = drilldown.world_attempts(session, "a", PageRequest(limit=2, offset=2))
        only_schema = drilldown.world_attempts(session, "a", PageRequest(), stage="database:schema")
        unknown = drilldown.attempt(session, 10_000)
        full = drilldown.attempt(session, attempts.rows[0]["id"])
    of_a = sorted((a for a in ATTEMPTS if a[1] == "a"), key=lambda a: a[3])  # made at night + attempt minutes
    assert attempts.total == len(of_a) and [(r["stage"], r["attempt"], r["outcome"]) for r in attempts.rows] == [
        (stage, attempt, outcome) for _, _, stage, attempt, outcome in of_a
    ]
    assert [r["id"] for r in second.rows] == [r["id"] for r in attempts.rows[2:4]] and second.next_offset is None
    assert {r["stage"] for r in only_schema.rows} == {"database:schema"} and only_schema.total == 2
    assert unknown is None
    assert (full["error_class"], full["error_text"]) == ERRORS[("a", "database:schema", 1)]
    assert (full["tokens_in"], full["cost_usd"], full["seconds"]) == (100, 0.01, 1.5)


def test_filters_narrow_every_query_in_sql(known):
    def narrowed(**given) -> dict:
        data = summary_of(known, Filters(**given))
        with known.session() as session:
            failed = drilldown.failed_worlds(session, Filters(**given), PageRequest())
        return {
            "nights": [n["night"] for n in data["nights"]],
            "worlds": [w["env_id"] for w in data["environments"]],
            "failed": [w["env_id"] for w in failed.rows],
            "classes": data["failure_classes"]["nights"],
        }

    assert narrowed(date_from=NIGHT_2.date(), date_to=NIGHT_2.date()) == {
        "nights": ["2026-11-02"],
        "worlds": ["c"],
        "failed": ["c"],
        "classes": ["2026-11-02"],
    }
    assert narrowed(date_to=NIGHT_1.date())["worlds"] == ["a", "b"]
    assert narrowed(run=RUNS[NIGHT_1]) == {
        "nights": ["2026-11-01"],
        "worlds": ["a", "b"],
        "failed": [],
        "classes": ["2026-11-01"],
    }
    assert narrowed(backend="openai") == {
        "nights": ["2026-11-02"],
        "worlds": ["c"],
        "failed": ["c"],
        "classes": ["2026-11-02"],
    }
    assert narrowed(category="retail")["worlds"] == ["a"] and narrowed(category="retail")["failed"] == []
    assert narrowed(category="re%")["worlds"] == []  # LIKE wildcards are matched literally
    with known.session() as session:
        assert [n["night"] for n in generation_nights(session, Filters(category="travel"))] == ["2026-11-02"]
    given = Filters(date_from=date(2026, 11, 1), run="r 1", backend="openai", category="retail")
    assert Filters.from_query(dict(httpx.QueryParams(given.query()[1:]))) == given
    assert Filters.from_query({"date_from": "", "run": " "}) == Filters() and not Filters().active
    with pytest.raises(ValueError, match="YYYY-MM-DD"):
        Filters.from_query({"date_from": "yesterday"})


@pytest.fixture()
def crowded(tmp_path) -> Catalog:
    """One night of 3 runs over 120 worlds with long ids: every third world fails its tasks twice and is published
    as failed, the others repair their tasks and are published good."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'crowded.db'}")
    with catalog.session() as s:
        for i in range(120):
            env = f"retail_store_inventory_and_returns_world_{i:04d}"
            broken = i % 3 == 0
            s.add(Environment(env_id=env, scenario_name=env, categories=["retail"]))
            for attempt in (1, 2):
                s.add(
                    StageAttempt(
                        run_id=f"run-{i % 3}",
                        env_id=env,
                        stage="tasks",
                        attempt=attempt,
                        outcome="failure" if broken or attempt == 1 else "success",
                        error_class=f"E{i % 4}" if broken or attempt == 1 else None,
                        cost_usd=0.001 * i,
                        created_at=NIGHT_1 + timedelta(seconds=i),
                    )
                )
            s.add(
                EnvironmentVersion(
                    env_id=env,
                    version=1,
                    content_key=f"k{i}",
                    manifest_digest=f"sha256:{i}",
                    status="failed" if broken else "good",
                    failed_stage="tasks" if broken else None,
                    failure_reason="tasks: no expected outcome" if broken else None,
                    generator_backend="openai",
                    created_at=NIGHT_1 + timedelta(seconds=i),
                )
            )
    yield catalog
    catalog.close()


def test_long_lists_are_pages_of_sql(crowded):
    night = NIGHT_1.date()
    with crowded.session() as session:
        pages = [drilldown.worlds_page(session, Filters(), PageRequest(limit=50, offset=o)) for o in (0, 50, 100)]
        failed = drilldown.worlds_page(session, Filters(), PageRequest(limit=7), status="failed")
        failed_versions = drilldown.failed_worlds(session, Filters(), PageRequest(limit=7, offset=35))
        runs = drilldown.night_runs(session, night, Filters(), PageRequest(limit=2))
        classed = drilldown.stage_worlds(session, night, "tasks", Filters(), PageRequest(limit=5), error_class="E0")
        data = summary(session)
    ids = [w["env_id"] for page in pages for w in page.rows]
    assert len(ids) == len(set(ids)) == 120 and {p.total for p in pages} == {120}
    assert (
        [len(p.rows) for p in pages] == [50, 50, 20] and pages[2].next_offset is None and pages[1].previous_offset == 0
    )
    costs = [w["cost_usd"] for page in pages for w in page.rows]
    assert costs == sorted(costs, reverse=True)  # most expensive first
    assert failed.total == 40 and len(failed.rows) == 7 and {w["status"] for w in failed.rows} == {"failed"}
    assert failed_versions.total == 40 and len(failed_versions.rows) == 5 and failed_versions.next_offset is None
    assert runs.total == 3 and len(runs.rows) == 2 and runs.next_offset == 2
    # E0: worlds 0, 4, 8, ... (every fourth), the broken ones among them failing both attempts
    assert classed.total == 30 and all("E0" in w["failure_classes"] for w in classed.rows)
    # the front page holds the top few, never a row per world
    assert len(data["environments"]) == 10 and data["environments_total"] == 120
    assert len(data["failed_worlds"]) == 10 and data["failed_worlds_total"] == 40
    html = TestClient(dashboard_app(crowded)).get("/").text
    assert html.count("<tr data-env=") == 20 and 'id="more-worlds"' in html and 'id="more-failed-worlds"' in html
    listing = TestClient(dashboard_app(crowded)).get("/worlds?status=failed&limit=15&offset=15")
    assert listing.status_code == 200 and listing.text.count("<tr data-env=") == 15
    assert 'class="next"' in listing.text and 'class="previous"' in listing.text


def test_a_chart_with_nothing_to_show_reads_zero_to_one():
    assert value_axis([0.0, None])["range"] == [0, 1] and "range" not in value_axis([0.0, 0.5])


def test_long_ids_are_cut_apart_on_a_slanted_axis():
    from worldsmith.dashboard.charts import LABEL_CHARS, category_axis

    labels = [f"retail_store_inventory_and_returns_world_{i:04d}" for i in range(3)]
    axis = category_axis(labels)
    assert axis["tickvals"] == labels and all(len(t) <= LABEL_CHARS for t in axis["ticktext"])
    assert len(set(axis["ticktext"])) == len(labels) and axis["tickangle"]  # cut ids stay apart, slanted


def test_one_night_charts_as_bars_on_a_readable_range():
    one_night = {
        "generation": {"nights": ["2026-11-01"], "stages": {"tasks": {**dict.fromkeys(RATES_AND_USAGE, [0.0])}}},
        "failure_classes": {"nights": [], "series": {}},
        "environments": [],
        "quality": {"checks": {}},
        "evaluations": [],
        "training": [],
        "cotraining": [],
    }
    charts = all_charts(one_night)
    assert '"type":"bar"' in charts["generation-failure_rate"]  # one night is a bar, not a lone dot
    assert '"range":[0,1]' in charts["generation-cost"]  # a night that cost nothing: 0..1, not -1..1


RATES_AND_USAGE = ("first_attempt_success", "repair_rate", "failure_rate", "tokens_in", "tokens_out", "cost_usd")


PREFECT = "http://127.0.0.1:4200"
#: The page has loaded and its charts have taken their columns' widths.
READY = (By.CSS_SELECTOR, "body[data-ready]")


def test_drill_down_pages_link_night_stage_world_attempt(known):
    client = TestClient(dashboard_app(known, prefect_ui_url=PREFECT))
    front = client.get("/").text
    assert 'href="/nights/2026-11-01"' in front and 'href="/worlds/c"' in front
    night = client.get("/nights/2026-11-01")
    assert night.status_code == 200 and 'href="/nights/2026-11-01/stages/tasks"' in night.text
    assert 'href="/nights/2026-11-01/stages/tasks?error_class=TaskFormatError"' in night.text
    assert 'href="/nights/2026-11-01/stages/database%3Aschema"' in night.text
    assert 'class="prefect"' not in night.text  # run-1 ran outside Prefect
    prefect_night = client.get("/nights/2026-11-02").text
    assert f'href="{flow_run_url(PREFECT, RUNS[NIGHT_2])}"' in prefect_night
    assert flow_run_url(PREFECT, RUNS[NIGHT_2]) == f"{PREFECT}/runs/flow-run/{RUNS[NIGHT_2]}"
    stage = client.get("/nights/2026-11-01/stages/tasks?error_class=TaskFormatError").text
    assert 'data-env="b"' in stage and 'data-env="a"' not in stage
    assert 'data-env="a"' in client.get("/nights/2026-11-01/stages/database%3Aschema").text
    assert "Never published" in client.get("/worlds/b").text
    world = client.get("/worlds/c").text
    assert "probes: t01 passes on the untouched database" in world and 'href="/attempts/' in world
    with known.session() as session:
        first = drilldown.world_attempts(session, "a", PageRequest(limit=1)).rows[0]
    attempt = client.get(f"/attempts/{first['id']}").text
    assert "line 3 " * 40 in attempt and "SchemaError" in attempt  # the full error text
    failed = client.get("/failed-worlds").text
    assert 'data-env="c"' in failed and "validate" in failed
    for path, code in (
        ("/worlds/nope", 404),
        ("/attempts/99999", 404),
        ("/nights/notadate", 404),
        ("/?date_from=yesterday", 400),
        ("/worlds?status=weird", 400),
        ("/worlds?limit=x", 400),
    ):
        assert client.get(path).status_code == code, path
    assert "YYYY-MM-DD" in client.get("/?date_from=yesterday").text


def test_filters_narrow_the_pages_with_their_links(known):
    client = TestClient(dashboard_app(known))
    narrowed = client.get("/?backend=openai").text
    assert 'tr data-night="2026-11-02"' in narrowed and 'tr data-night="2026-11-01"' not in narrowed
    assert 'value="openai"' in narrowed and "clear filters" in narrowed
    # links carry the filters on
    assert 'href="/nights/2026-11-02?backend=openai"' in narrowed
    assert client.get("/api/summary?category=retail").json() == json.loads(
        json.dumps(summary_of(known, Filters(category="retail")))
    )
    runs = client.get(f"/nights/2026-11-01?run={RUNS[NIGHT_2]}").text
    assert "No generation runs this night." in runs


def test_a_page_reloads_itself_only_when_asked(known):
    client = TestClient(dashboard_app(known))
    assert '<meta http-equiv="refresh" content="30">' in client.get("/?refresh=30").text
    assert 'http-equiv="refresh"' not in client.get("/").text and 'id="refresh"' in client.get("/").text


@pytest.mark.sandbox
def test_browser_walks_from_a_night_to_an_attempt(known, browser, tmp_path):
    shots = tmp_path / "screenshots"
    shots.mkdir()
    print(f"dashboard screenshots: {shots}")

    def shoot(name: str) -> None:
        browser.save_screenshot(str(shots / f"{name}.png"))

    def click(selector: str) -> None:
        browser.find_element(By.CSS_SELECTOR, selector).click()

    with BackgroundServer(dashboard_app(known, prefect_ui_url=PREFECT)) as server:
        browser.get(server.url)
        WebDriverWait(browser, PROCESS_S).until(expected_conditions.presence_of_element_located(READY))
        shoot("1-front")
        click("#table-nights tr[data-night='2026-11-01'] a.night")
        assert browser.find_element(By.TAG_NAME, "h2").text == "Night 2026-11-01 (UTC)"
        shoot("2-night")
        click("#table-stages tr[data-stage='tasks'] a.stage")
        assert browser.find_element(
            By.CSS_SELECTOR, "#table-stage-worlds tr[data-env='b'] td[data-key='succeeded']"
        ).text == ("failed")
        shoot("3-stage")
        click("#table-stage-worlds tr[data-env='b'] a.world")
        assert browser.find_element(By.TAG_NAME, "h2").text == "World b"
        outcomes = [
            e.text for e in browser.find_elements(By.CSS_SELECTOR, "#table-world-attempts td[data-key='outcome']")
        ]
        assert outcomes == ["failure", "failure"]  # the page lists the tasks stage the walk came from
        shoot("4-world")
        click("#table-world-attempts a.attempt")
        assert browser.find_element(By.ID, "error-text").text == ERRORS[("b", "tasks", 1)][1]
        shoot("5-attempt")
        click(".crumbs a[href='/nights/2026-11-01']")  # back up the breadcrumbs, then filter the front page
        assert browser.find_element(By.TAG_NAME, "h2").text == "Night 2026-11-01 (UTC)"
        browser.get(server.url)
        Select(browser.find_element(By.NAME, "backend")).select_by_value("openai")  # a list of the catalog's
        click("#filters button[type='submit']")
        WebDriverWait(browser, PROCESS_S).until(expected_conditions.url_contains("backend=openai"))
        nights = [
            e.get_attribute("data-night")
            for e in browser.find_elements(By.CSS_SELECTOR, "#table-nights tr[data-night]")
        ]
        assert nights == ["2026-11-02"]
        shoot("6-filtered")
    assert sorted(p.name for p in shots.iterdir()) == [
        "1-front.png",
        "2-night.png",
        "3-stage.png",
        "4-world.png",
        "5-attempt.png",
        "6-filtered.png",
    ]


@pytest.mark.sandbox
def test_browser_shows_a_crowded_night_with_long_ids_apart(crowded, browser, tmp_path):
    from worldsmith.dashboard.charts import LABEL_CHARS

    with BackgroundServer(dashboard_app(crowded)) as server:
        browser.get(server.url)
        WebDriverWait(browser, PROCESS_S).until(expected_conditions.presence_of_element_located(READY))
        browser.save_screenshot(str(tmp_path / "crowded-front.png"))
        print(f"dashboard screenshot: {tmp_path / 'crowded-front.png'}")
        assert len(browser.find_elements(By.CSS_SELECTOR, "#chart-env-cost .bars .point")) == 10  # the top 10 only
        ticks = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#chart-env-cost .xtick text")]
        assert len(set(ticks)) == 10 and all(len(t) <= LABEL_CHARS for t in ticks)  # shortened, still distinct
        # every chart is drawn as wide as its column, not wider (no chart under its neighbour)
        overflow = browser.execute_script(
            "return [...document.querySelectorAll('.js-plotly-plot')].map("
            "p => p.querySelector('.main-svg').getBoundingClientRect().width - p.getBoundingClientRect().width)"
        )
        assert max(overflow) <= 1
