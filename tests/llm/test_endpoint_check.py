"""The preflight of a model endpoint (llm/endpoint_check.py) against the scripted OpenAI-compatible server:
each way an endpoint cannot answer is one line naming the URL and the setting to fix, before any work."""

from __future__ import annotations

import pytest
from support.llm_server import ScriptedLLM, error_reply, json_reply
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.llm.endpoint_check import Endpoint, EndpointUnavailable, check_endpoint
from worldsmith.localserver import free_port
from worldsmith.settings import get_settings

pytestmark = pytest.mark.unit


def endpoint(url: str | None, key: str | None = "sk-test", model: str = "test-model") -> Endpoint:
    return Endpoint("the model endpoint", url, key, model)


def refusal(target: Endpoint) -> str:
    with pytest.raises(EndpointUnavailable) as caught:
        check_endpoint(target)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_refused_key_names_the_url_and_the_key_setting():
    llm = ScriptedLLM([json_reply({})], models=error_reply(401))
    with llm.serve() as server:
        message = refusal(endpoint(f"{server.url}/v1"))
        unset = refusal(endpoint(f"{server.url}/v1", key=None))
    assert f"{server.url}/v1 refused the API key (HTTP 401)" in message and "WORLDSMITH_LLM_API_KEY" in message
    assert "WORLDSMITH_LLM_API_KEY is not set" in unset
    assert llm.requests == []  # nothing was generated


def test_a_model_the_endpoint_does_not_serve_names_the_model_setting():
    llm = ScriptedLLM([json_reply({})], models=["served-a", "served-b"])
    with llm.serve() as server:
        message = refusal(endpoint(f"{server.url}/v1", model="missing"))
        check_endpoint(endpoint(f"{server.url}/v1", model="served-b"))  # served: passes
    assert "serves no model 'missing' (it serves served-a, served-b)" in message
    assert "WORLDSMITH_LLM_MODEL" in message


def test_an_unreachable_port_names_the_url_and_the_base_url_setting():
    url = f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
    message = refusal(endpoint(url))
    assert f"the model endpoint {url} cannot be reached" in message and "WORLDSMITH_LLM_BASE_URL" in message


def test_an_endpoint_without_a_listing_passes_and_an_unset_one_names_the_variables():
    llm = ScriptedLLM([json_reply({})])  # GET /v1/models answers 404: the first call will tell
    with llm.serve() as server:
        check_endpoint(endpoint(f"{server.url}/v1"))
    message = refusal(endpoint(None, key=None))
    assert "is not set" in message and "WORLDSMITH_LLM_BASE_URL" in message and "WORLDSMITH_LLM_API_KEY" in message


@pytest.mark.parametrize(
    ("models", "expected"),
    [
        (error_reply(401), "refused the API key"),
        (["other"], "serves no model 'test-model'"),
        (None, "cannot be reached"),
    ],
)
def test_generate_is_refused_in_one_line_before_any_work(home, monkeypatch, models, expected):
    """`generate --backend openai` checks the endpoint once: one line, exit 1, no generation request."""
    llm = ScriptedLLM([json_reply({})], models=models)
    with llm.serve() as server:
        url = f"{server.url}/v1" if models is not None else f"http://127.0.0.1:{free_port('127.0.0.1')}/v1"
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", url)
        monkeypatch.setenv("WORLDSMITH_LLM_MODEL", "test-model")
        get_settings.cache_clear()
        result = CliRunner().invoke(app, ["generate", "--backend", "openai", "--count", "1"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 1 and len(lines) == 1, result.output
    assert expected in lines[0] and url in lines[0]
    assert llm.requests == []


def test_generate_with_no_endpoint_set_names_the_variables(home, monkeypatch):
    for name in ("WORLDSMITH_LLM_BASE_URL", "WORLDSMITH_LLM_API_KEY", "WORLDSMITH_LLM_API_KEY_BLOCK"):
        monkeypatch.delenv(name, raising=False)
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["generate", "--backend", "openai", "--count", "1"])
    assert result.exit_code == 1 and len(result.output.strip().splitlines()) == 1, result.output
    assert "WORLDSMITH_LLM_BASE_URL" in result.output and "WORLDSMITH_LLM_API_KEY" in result.output


def test_a_judged_training_run_checks_the_judge_endpoint(monkeypatch):
    """`train --reward judge` (check_can_train): the judge's own endpoint and key, named by their settings."""
    from worldsmith.training.config import JudgeConfig
    from worldsmith.training.judged_reward import check_judge

    monkeypatch.setenv("JUDGE_KEY", "sk-wrong")
    llm = ScriptedLLM([json_reply({})], models=error_reply(403))
    with llm.serve() as server:
        config = JudgeConfig(base_url=f"{server.url}/v1", model="judge-model", api_key_variable="JUDGE_KEY")
        with pytest.raises(EndpointUnavailable, match=r"the judge endpoint .* refused the API key.*set JUDGE_KEY"):
            check_judge(config)
    down = JudgeConfig(base_url=f"http://127.0.0.1:{free_port('127.0.0.1')}/v1", model="judge-model")
    with pytest.raises(EndpointUnavailable, match="cannot be reached.*judge.base_url"):
        check_judge(down)
