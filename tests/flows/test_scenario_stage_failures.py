"""A scenario stage that fails after its attempts ends the run Failed with one line, never a traceback:
an endpoint answering prose, one answering `choices: []`, and `--max-attempts 1` with a fault."""

from __future__ import annotations

import pytest
from support.llm_server import ProceduralLLM, ScriptedLLM, empty_reply, text_reply
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.settings import get_settings

pytestmark = pytest.mark.flow


@pytest.mark.parametrize(
    ("server", "options", "why"),
    [
        (lambda: ScriptedLLM([text_reply("Sure! Here are some great scenarios for you.")]), [], "no JSON object found"),
        (lambda: ScriptedLLM([empty_reply()]), ["--max-attempts", "2"], "empty `choices`"),
        (lambda: ProceduralLLM(faults={"scenario": ["malformed_json"]}), ["--max-attempts", "1"], "after 1 attempts"),
    ],
    ids=["prose", "empty-choices", "one-attempt-with-a-fault"],
)
def test_a_failed_scenario_stage_ends_the_run_in_one_line(prefect_api, home, monkeypatch, server, options, why):
    llm = server()
    with llm.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")
        monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-test")
        get_settings.cache_clear()
        result = CliRunner().invoke(
            app, ["generate", "--backend", "openai", "--count", "1", "--concurrency", "1", *options]
        )
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("the scenario stage failed, no world was built") and why in last, result.output
