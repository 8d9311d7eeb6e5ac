"""Expected failures of the CLI's settings and infrastructure: one line naming the fix, exit 2 for a bad
setting and 1 for a failure of something the command depends on, never a traceback."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.localserver import free_port
from worldsmith.settings import get_settings

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    ("url", "code", "words"),
    [
        ("mysql://user:secret@127.0.0.1/db", 2, "the catalog cannot live in mysql"),
        ("not a url", 2, "is not a database URL"),
        (f"postgresql://user:secret@127.0.0.1:{free_port('127.0.0.1')}/db", 1, "cannot be used"),
    ],
    ids=["mysql", "not-a-url", "postgresql-nobody-listens"],  # stable ids: the free port differs per process
)
def test_a_catalog_that_cannot_be_used_is_one_line(home, monkeypatch, url, code, words):
    monkeypatch.setenv("WORLDSMITH_CATALOG_URL", url)
    get_settings.cache_clear()
    result = CliRunner().invoke(app, ["catalog", "ls"])
    lines = result.output.strip().splitlines()
    assert result.exit_code == code and len(lines) == 1, result.output
    assert words in lines[0] and "WORLDSMITH_CATALOG_URL" in lines[0]
    assert "secret" not in lines[0]  # the password is never printed


def test_the_gpu_profile_without_cuda_is_refused_before_the_flow(home):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    for command in (["train"], ["cotrain"]):
        result = CliRunner().invoke(app, [*command, "--set", "any", "--profile", "gpu"])
        lines = result.output.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1 and "needs a CUDA device" in lines[0], result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["eval", "--set", "s", "--split", "bogus"], "'bogus' is not one of 'all', 'train', 'validation'"),
        (["eval", "--set", "s", "--tool-format", "xml"], "'xml' is not one of 'native', 'text'"),
        (["train", "--set", "s", "--history", "all"], "'all' is not one of 'windowed', 'full'"),
        (["train", "--set", "s", "--profile", "tpu"], "'tpu' is not one of 'cpu-test', 'gpu'"),
    ],
)
def test_choice_options_name_their_values(args, words):
    result = CliRunner().invoke(app, args)
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--count", "-3"], "first at count"),
        (["--backend", "gpt5"], "unknown backend 'gpt5'"),
        (["--scenarios", "/nonexistent/seeds.jsonl"], "scenario file /nonexistent/seeds.jsonl not found"),
    ],
)
def test_bad_generate_input_is_refused_before_the_flow(home, args, words):
    result = CliRunner().invoke(app, ["generate", *args])
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and words in lines[0], result.output


@pytest.mark.flow
def test_a_flow_runs_expected_failure_is_logged_without_its_traceback(prefect_api, caplog):
    """The CLI's flows log an expected failure (one that states its fix) as its one line; a bug keeps
    its traceback."""
    import logging

    from prefect import flow

    from worldsmith.cli.console import ExpectedFailures, quiet_expected_failures
    from worldsmith.failures import UserFixable

    class NodeFailed(UserFixable, RuntimeError):
        exit_code = 1

    @flow(name="fails-as-expected")
    def fails(bug: bool) -> None:
        raise ValueError("a bug") if bug else NodeFailed("training node 1 failed: set rendezvous_host")

    quiet_expected_failures()
    try:
        for bug in (False, True):
            with caplog.at_level(logging.ERROR), pytest.raises(ValueError if bug else NodeFailed):
                fails(bug)
        logged = [r for r in caplog.records if r.name == "prefect.flow_runs" and r.levelno == logging.ERROR]
        expected, bug = logged[0], logged[-1]
        assert "training node 1 failed: set rendezvous_host" in expected.getMessage() and expected.exc_info is None
        assert "a bug" in bug.getMessage() and bug.exc_info is not None
    finally:
        for name in ("prefect.flow_runs", "prefect.task_runs"):
            for each in [f for f in logging.getLogger(name).filters if isinstance(f, ExpectedFailures)]:
                logging.getLogger(name).removeFilter(each)


def test_openenv_with_several_gateway_processes_is_one_line_naming_the_option(home):
    result = CliRunner().invoke(
        app, ["env", "serve", "examples/bundles/retail_store", "--protocol", "openenv", "--processes", "2"]
    )
    lines = result.output.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1, result.output
    assert "--protocol openenv" in lines[0] and "leave out --processes" in lines[0]
