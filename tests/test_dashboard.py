"""The dashboard: its numbers for a known catalog, over HTTP, and as a browser renders them."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait
from starlette.testclient import TestClient

from worldsmith.dashboard.app import dashboard_app
from worldsmith.dashboard.data import summary
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


CRASH = "crashed: Flow run infrastructure exited with non-zero status code -9."

#: An older catalog's record of world b failing: the pseudo-stage "environment" (not a stage, no tokens).
LEGACY_FAILURE = (NIGHT_1, "b", "environment", 1, "failure")


def usage(attempt: int) -> dict[str, float]:
    """The tokens and cost the known catalog records for an attempt (more for later attempts)."""
    return {"tokens_in": 100 * attempt, "tokens_out": 40, "cost_usd": 0.01 * attempt}


def usage_of(rows) -> dict[str, float]:
    """Attempts, tokens and cost of `rows` (entries of ATTEMPTS), as the dashboard sums them."""
    used = [usage(row[3]) for row in rows]
    return {
        "attempts": len(used),
        "tokens_in": sum(u["tokens_in"] for u in used),
        "tokens_out": sum(u["tokens_out"] for u in used),
        "cost_usd": round(sum(u["cost_usd"] for u in used), 6),
    }


@pytest.fixture()
def known(tmp_path) -> Catalog:
    """A catalog holding a known set of runs: two generation nights, quality reports, a set, two
    evaluations, a three-step training run, a co-training run and a training run that crashed."""
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.session() as s:
        for night, env, stage, attempt, outcome in [*ATTEMPTS, LEGACY_FAILURE]:
            s.add(
                StageAttempt(
                    run_id=f"run-{night.day}",
                    env_id=env,
                    stage=stage,
                    attempt=attempt,
                    outcome=outcome,
                    **(usage(attempt) if stage != "environment" else {}),
                    created_at=night,
                )
            )
        for env in ("a", "c"):
            s.add(Environment(env_id=env, scenario_name=env))
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
                metrics={"overall": {"pass@1": 1.0, "episodes": 10, "env_error_rate": 0.0, "format_error_rate": 0.0}},
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
                        "env_error_rate": 0.1,
                        "format_error_rate": 0.2,
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
    assert sum(n["tokens_in"] for n in data["nights"]) == sum(e["tokens_in"] for e in data["environments"])
    assert data["environments"] == [
        {"env_id": "a", "attempts": 3, "tokens_in": 400, "tokens_out": 120, "cost_usd": 0.04, "status": "good"},
        {"env_id": "b", "attempts": 3, "tokens_in": 400, "tokens_out": 120, "cost_usd": 0.04, "status": "unpublished"},
        {"env_id": "c", "attempts": 3, "tokens_in": 400, "tokens_out": 120, "cost_usd": 0.04, "status": "failed"},
    ]
    assert data["quality"] == {
        "versions": {"failed": 1, "good": 1},
        "checks": {"expectations": {"passed": 2, "failed": 0}, "probes": {"passed": 1, "failed": 1}},
        "failure_reasons": {"probes": 1},
    }
    assert [(s["name"], s["members"], s["train"], s["validation"]) for s in data["sets"]] == [("nightly", 2, 1, 1)]
    assert [
        (e["policy"], e["samples"], e["pass@1"], e["pass@k"], e["env_error_rate"]) for e in data["evaluations"]
    ] == [("reference", 1, 1.0, 1.0, 0.0), ("random", 4, 0.25, 0.5, 0.1)]
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


def test_empty_catalog_renders_and_api_matches_summary(known, tmp_path):
    empty = Catalog(f"sqlite:///{tmp_path / 'empty.db'}")
    page = TestClient(dashboard_app(empty)).get("/")
    assert page.status_code == 200 and "No generation runs yet." in page.text and "No training runs yet." in page.text
    assert "No co-training runs yet." in page.text
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


def test_browser_renders_the_charts_with_the_catalogs_numbers(known, browser):
    with BackgroundServer(dashboard_app(known)) as server:
        assert httpx.get(f"{server.url}/healthz").text == "ok"
        browser.get(server.url)
        WebDriverWait(browser, 30).until(
            expected_conditions.presence_of_element_located((By.CSS_SELECTOR, "#chart-training .main-svg"))
        )
        charts = browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot")
        assert len(charts) == 11 and all(c.find_elements(By.CSS_SELECTOR, ".main-svg") for c in charts)

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
        assert traces("evaluations") == {"pass@1": [1.0, 0.25], "env_error rate": [0.0, 0.1]}
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
