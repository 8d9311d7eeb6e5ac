"""The `evaluate` flow and `worldsmith eval` on a real (test-harness) Prefect server."""

from __future__ import annotations

import json

import pytest
from datasets import load_dataset
from prefect.client.orchestration import get_client
from sqlmodel import select
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.flows.evaluate import run_evaluate
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import EvaluationRun
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import open_store
from worldsmith.storage.publish import publish
from worldsmith.storage.sets import SetQuery, create_set
from worldsmith.tasks.parameters import EvaluateParameters

pytestmark = pytest.mark.flow


@pytest.fixture()
def env_set(home, golden):
    """A set of the golden bundle and two procedural worlds."""
    settings = get_settings()
    store, catalog = open_store(settings.resolved_store_url()), open_catalog()
    for bundle in (golden, procedural_bundle("retail", 2), procedural_bundle("clinic", 2)):
        publish(bundle, store, catalog)
    create_set(catalog, "evalset", SetQuery(validation_fraction=0.0))
    return "evalset"


def test_evaluation_tells_the_reference_policy_from_a_random_one(prefect_api, env_set):
    reference = run_evaluate(EvaluateParameters(set_name=env_set, policy="reference"))
    assert reference.overall.pass_at_1 == 1.0 and reference.overall.episodes == 30
    assert set(reference.per_env) == {"retail_store", "retail_2", "clinic_2"}
    random_run = run_evaluate(EvaluateParameters(set_name=env_set, policy="random", samples=3))
    assert random_run.overall.episodes == 90 and random_run.overall.pass_at_1 < 0.3
    assert random_run.overall.k == 3 and random_run.overall.pass_at_k >= random_run.overall.pass_at_1
    with open_catalog().session() as session:
        runs = session.exec(select(EvaluationRun).order_by(EvaluationRun.id)).all()
    assert [(r.policy, r.status, r.samples) for r in runs] == [
        ("reference", "completed", 1),
        ("random", "completed", 3),
    ]
    assert runs[0].metrics["overall"]["pass@1"] == 1.0 and runs[1].finished_at is not None
    assert runs[1].metrics["overall"]["pass@3"] == random_run.overall.pass_at_k  # the stored shape
    trajectories = load_dataset("parquet", data_files=random_run.trajectories.parquet, split="train")
    assert len(trajectories) == 90 and set(trajectories["policy"]) == {"random"}


async def _artifact_keys(flow_run_id: str) -> set[str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        artifacts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key for a in artifacts}


def test_cli_eval_answers_as_json_or_a_table_leaving_prefect_artifacts(prefect_api, env_set, tables_at_a_fixed_width):
    import asyncio

    result = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "reference", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["overall"]["pass@1"] == 1.0 and report["overall"]["env_error_rate"] == 0.0
    with open_catalog().session() as session:
        run = session.get(EvaluationRun, report["run_id"])
    assert run.flow_run_id and asyncio.run(_artifact_keys(run.flow_run_id)) >= {
        "evaluation-per-env",
        "evaluation-summary",
    }
    table = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "random"])
    assert table.exit_code == 0 and f"evaluation {report['run_id'] + 1}: random on evalset" in table.output


def test_a_bad_eval_request_is_refused_naming_the_bad_value(prefect_api, env_set):
    bad = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "gpt"])
    assert bad.exit_code != 0 and "unknown policy 'gpt'" in bad.output
    missing = CliRunner().invoke(app, ["eval", "--set", "nope"])
    assert missing.exit_code == 2 and "no environment set 'nope'" in missing.output
    assert len(missing.output.strip().splitlines()) == 1, missing.output  # answered before any flow ran
    empty = CliRunner().invoke(app, ["eval", "--set", env_set, "--split", "validation"])
    assert empty.exit_code == 2 and "has no members in split 'validation'" in empty.output, empty.output


def test_trajectories_export_to_datasets(prefect_api, env_set, tmp_path):
    report = run_evaluate(EvaluateParameters(set_name=env_set, policy="reference"))
    runner = CliRunner()
    sft = runner.invoke(app, ["data", "sft", report.trajectories.jsonl, str(tmp_path / "sft")])
    transitions = runner.invoke(app, ["data", "transitions", report.trajectories.jsonl, str(tmp_path / "wm")])
    assert sft.exit_code == 0 and transitions.exit_code == 0, sft.output + transitions.output
    assert len(load_dataset("json", data_files=str(tmp_path / "sft" / "sft.jsonl"), split="train")) == 30
    assert len(load_dataset("parquet", data_files=str(tmp_path / "wm" / "transitions.parquet"), split="train")) > 30


@pytest.mark.e2e
def test_local_model_policy_through_the_flow(prefect_api, env_set, tiny_model):
    create_set(open_catalog(), "golden-only", SetQuery(env_ids=["retail_store"], validation_fraction=0.0))
    report = run_evaluate(
        EvaluateParameters(
            set_name="golden-only", policy=f"hf:{tiny_model}", max_turns=2, max_new_tokens=12, concurrency=2
        )
    )
    overall = report.overall
    assert overall.episodes == 10 and overall.pass_at_1 == 0.0 and overall.env_error_rate == 0.0
    rows = [json.loads(line) for line in open(report.trajectories.jsonl)]
    assert all(r["policy"] == f"hf:{tiny_model}" and r["turn_records"][0]["completion_ids"] for r in rows)


def _one_line(result) -> str:
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    return lines[0]


def test_an_unreachable_policy_is_refused_before_the_run(env_set, monkeypatch):
    """Infrastructure, not the agent: an endpoint that is down or a model path that holds no model is one
    line, exit 1, and no evaluation run is started."""
    from worldsmith.localserver import free_port

    monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"http://127.0.0.1:{free_port('127.0.0.1')}/v1")
    get_settings.cache_clear()
    down = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "openai:some-model"])
    assert down.exit_code == 1 and "cannot be reached" in _one_line(down) and "WORLDSMITH_LLM_BASE_URL" in down.output
    judged = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "reference", "--judge", "judge-model"])
    assert judged.exit_code == 1 and "the judge endpoint" in _one_line(judged) and "cannot be reached" in judged.output
    missing = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "hf:/nonexistent/model"])
    assert missing.exit_code == 1 and "no model at /nonexistent/model" in _one_line(missing)
    with open_catalog().session() as session:
        assert session.exec(select(EvaluationRun)).all() == []


def test_an_endpoint_failing_mid_run_fails_the_run_not_the_agent(prefect_api, env_set, monkeypatch):
    """The endpoint answers the preflight's model listing but refuses every completion (401): the run
    fails with one line naming the key's setting; no episode is scored as agent_error."""
    from support.console_capture import prefect_console
    from support.llm_server import ScriptedLLM, error_reply

    terminal = prefect_console(monkeypatch)
    llm = ScriptedLLM([error_reply(401) for _ in range(64)])
    with llm.serve() as server:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{server.url}/v1")
        get_settings.cache_clear()
        result = CliRunner().invoke(app, ["eval", "--set", env_set, "--policy", "openai:some-model"])
    assert result.exit_code == 1 and "refused the API key" in result.output.splitlines()[-1]
    # quiet: the log file's name and the one line, not the 401 once per task (Prefect's lines: the log file)
    assert len(result.output.strip().splitlines()) == 2 and result.output.startswith("log: "), result.output
    assert terminal.getvalue() == ""
    assert "WORLDSMITH_LLM_API_KEY" in result.output
    with open_catalog().session() as session:
        (run,) = session.exec(select(EvaluationRun)).all()
    assert run.status == "failed" and "overall" not in run.metrics
