"""A scenario stage that fails after its attempts ends the run Failed with one line, never a traceback:
an endpoint answering prose, one answering `choices: []`, and `--max-attempts 1` with a fault."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.console_capture import prefect_console
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
def test_a_failed_scenario_stage_ends_the_run_in_one_line(prefect_api, home, monkeypatch, capfd, server, options, why):
    """Quiet too: the progress bar, the log file's name and the one line; Prefect's lines in the log file."""
    terminal = prefect_console(monkeypatch)
    capfd.readouterr()
    result = generate(monkeypatch, server(), options)
    printed = capfd.readouterr().err.strip().splitlines() + result.output.strip().splitlines()
    assert terminal.getvalue() == ""  # Prefect's console handler printed nothing
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    last = result.output.strip().splitlines()[-1]
    assert last.startswith("the scenario stage failed, no world was built") and why in last, result.output
    logs = [line for line in printed if line.startswith("log: ")]
    assert len(printed) <= 4 and len(logs) == 1, printed  # the bar (here 1 line), the log file, the answer
    assert "Finished in state Failed" in Path(logs[0].removeprefix("log: ")).read_text()


def test_verbose_shows_prefects_lines_on_the_terminal(prefect_api, home, monkeypatch):
    terminal = prefect_console(monkeypatch)
    result = generate(monkeypatch, ScriptedLLM([empty_reply()]), ["--max-attempts", "1"], verbose=True)
    assert result.exit_code == 1 and "Finished in state Failed" in terminal.getvalue()


def generate(monkeypatch, llm, options, verbose=False):
    """`worldsmith [--verbose] generate --backend openai --count 1` against `llm`."""
    with llm.serve() as background:
        monkeypatch.setenv("WORLDSMITH_LLM_BASE_URL", f"{background.url}/v1")
        monkeypatch.setenv("WORLDSMITH_LLM_API_KEY", "sk-test")
        get_settings.cache_clear()
        return CliRunner().invoke(
            app,
            [
                *(["--verbose"] if verbose else []),
                "generate",
                "--backend",
                "openai",
                "--count",
                "1",
                "--concurrency",
                "1",
            ]
            + options,
        )
