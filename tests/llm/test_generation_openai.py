"""The pipeline on the `openai` backend against a local OpenAI-compatible server that answers
with procedural content and injects every kind of fault."""

from __future__ import annotations

import pytest
from support.llm_server import ProceduralLLM, ScriptedLLM, error_reply
from support.patience import MOMENTS_S

from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.models.bundle import Scenario
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.pipeline import build_environment

pytestmark = pytest.mark.sandbox

AMAZON = Scenario(
    name="Amazon",
    description="Amazon is the world's largest e-commerce platform: users browse products, order, pay and return them.",
)


@pytest.fixture()
def llm_server():
    servers = []

    def start(**kwargs) -> tuple[ProceduralLLM, str]:
        server = ProceduralLLM(**kwargs)
        background = server.serve()
        background.__enter__()
        servers.append(background)
        return server, f"{background.url}/v1"

    yield start
    for background in servers:
        background.__exit__(None, None, None)


def test_every_llm_fault_is_survived_with_a_record_of_it(runtime, llm_server):
    faults = {
        "tasks": ["slow", "malformed_json", "empty_choices"],
        "schema": ["sql_error"],
        "seed": ["http_429", "seed_fk"],
        "tool_plan": ["schema_violation", "http_500"],
        "tool_code": ["tool_raises"],
        "verifiers": ["truncated", "verifier_accepts_untouched"],
    }
    server, url = llm_server(faults=faults, seed=2)
    generator = OpenAIGenerator(
        model="local-model",
        base_url=url,
        api_key="sk-local",
        timeout_s=3.0,  # the limit under test: the `slow` fault's answer comes only once the client gives up
        retries=3,
        backoff_s=0.05,
        prices={"local-model": {"input": 1.0, "output": 2.0}},
    )
    log = AttemptLog("openai-run")
    result = build_environment(AMAZON, 2, generator, runtime, log)
    assert result.good, result.reason
    assert (
        result.bundle.manifest.generator.backend == "openai" and result.bundle.manifest.generator.model == "local-model"
    )
    assert all(not kinds for kinds in server.faults.values())  # every scheduled fault was served

    records = [(a.stage, a.attempt, a.outcome, a.error_class, a.error_text or "") for a in log.attempts]

    def find(stage, predicate):
        return [r for r in records if r[0] == stage and predicate(r)]

    assert find(
        "tasks", lambda r: r[2] == "failure" and "APITimeoutError" in r[4] and r[3] == "invalid_json"
    )  # slow, then malformed JSON
    assert find("tasks", lambda r: r[3] == "empty_choices")
    assert find("database:schema", lambda r: r[3] == "sql_error" and "syntax error" in r[4])
    assert find("database:seed", lambda r: r[3] == "seed_error" and "FOREIGN KEY" in r[4] and "HTTP 429" in r[4])
    assert find("tools:spec", lambda r: r[3] == "schema_mismatch" and "does not match ToolPlan" in r[4])
    assert find("tools:spec", lambda r: r[2] == "success" and r[3] == "retried" and "HTTP 500" in r[4])
    assert find("tools:code", lambda r: r[3] == "tool_crash" and "no such column" in r[4])
    assert find("verifiers", lambda r: r[3] == "truncated" and "truncated" in r[4])
    assert find("verifiers", lambda r: r[3] == "verifier_accepts_untouched")
    tokens = sum(a.tokens_in + a.tokens_out for a in log.attempts)
    cost = sum(a.cost_usd for a in log.attempts)
    assert tokens > 0 and cost == pytest.approx(sum(a.tokens_in * 1e-6 + a.tokens_out * 2e-6 for a in log.attempts))


def test_exhausted_transient_faults_fail_the_stage_loudly(runtime, llm_server):
    from worldsmith.llm.errors import TransientFault

    _server, url = llm_server(faults={"tasks": ["http_500"] * 10})
    generator = OpenAIGenerator(model="m", base_url=url, timeout_s=MOMENTS_S, retries=2, backoff_s=0.01)
    log = AttemptLog("transient")
    with pytest.raises(TransientFault, match="3 attempts failed; last: InternalServerError"):
        build_environment(AMAZON, 0, generator, runtime, log)
    assert [(a.stage, a.outcome) for a in log.attempts] == [("tasks", "transient")]  # left to Prefect's retries


def test_context_length_fails_the_world_at_once_with_its_class(runtime, llm_server):
    server, url = llm_server(faults={"tasks": ["context_length"]})
    generator = OpenAIGenerator(model="m", base_url=url, timeout_s=MOMENTS_S, retries=2, backoff_s=0.01)
    log = AttemptLog("context")
    result = build_environment(AMAZON, 0, generator, runtime, log)
    assert not result.good and result.failed_stage == "tasks" and "context" in result.reason
    assert [(a.stage, a.error_class) for a in log.attempts] == [("tasks", "context_length")]
    assert len(server.requests) == 1  # neither retried nor repaired


def test_auth_failure_stops_the_world_after_one_request(runtime, llm_server):
    from worldsmith.llm.errors import EndpointAuthFault

    server, url = llm_server(faults={"tasks": ["http_401"] * 10})
    generator = OpenAIGenerator(
        model="m", base_url=url, api_key="sk-bad", timeout_s=MOMENTS_S, retries=2, backoff_s=0.01
    )
    log = AttemptLog("auth")
    with pytest.raises(EndpointAuthFault, match="WORLDSMITH_LLM_API_KEY") as info:
        build_environment(AMAZON, 0, generator, runtime, log)
    assert info.value.fatal and len(server.requests) == 1
    assert [(a.stage, a.outcome, a.error_class) for a in log.attempts] == [("tasks", "failure", "auth")]


@pytest.mark.flow
def test_generate_with_a_bad_key_ends_in_one_line_naming_the_setting(prefect_api, home, monkeypatch):
    from typer.testing import CliRunner

    from worldsmith.cli import app
    from worldsmith.settings import get_settings

    server = ScriptedLLM([error_reply(401, message="Incorrect API key provided")])
    with server.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")
        monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-wrong")
        get_settings.cache_clear()
        result = CliRunner().invoke(app, ["generate", "--backend", "openai", "--count", "1", "--concurrency", "1"])
    assert result.exit_code == 1, result.output
    assert len(server.requests) == 1  # neither the client, the stage nor Prefect retried it
    [line] = [line for line in result.output.splitlines() if "WORLDSMITH_LLM_API_KEY" in line and "|" not in line]
    assert "HTTP 401" in line and "Traceback" not in result.output
