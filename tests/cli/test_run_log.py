"""Quiet by default (cli/run_log.py): Prefect's log lines go to the log file; with --verbose to the terminal
too, a repeated warning or error once, counted."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console

from worldsmith.cli import run_log
from worldsmith.cli.run_log import RepeatedOnce, flow_logs

pytestmark = pytest.mark.unit


@pytest.fixture()
def terminal(monkeypatch):
    from prefect.logging.handlers import PrefectConsoleHandler

    stream = io.StringIO()
    handler = PrefectConsoleHandler(stream=stream)
    handler.console = Console(file=stream, width=200)
    logging.getLogger().addHandler(handler)
    yield stream
    logging.getLogger().removeHandler(handler)


def log_failures(times: int) -> None:
    logger = logging.getLogger("prefect.task_runs")
    for task in range(times):
        extra = {"task_run_name": f"task-{task}", "task_run_id": None, "flow_run_id": None}
        logger.error("Finished in state Failed('HTTP 401: refused the API key')", extra=extra)
        logger.info("task %d done", task, extra=extra)


def test_quiet_by_default_the_lines_go_to_the_log_file_only(home, terminal, monkeypatch):
    monkeypatch.setitem(run_log.VERBOSE, "on", False)
    with flow_logs("eval") as path:
        log_failures(50)
    assert terminal.getvalue() == ""
    assert path.read_text().count("refused the API key") == 50 and path.parent == home / "logs"


def test_verbose_prints_a_repeated_error_once_with_a_count(home, terminal, monkeypatch, capsys):
    monkeypatch.setitem(run_log.VERBOSE, "on", True)
    with flow_logs("eval"):
        log_failures(50)
    shown = terminal.getvalue()
    assert shown.count("refused the API key") == 1 and shown.count("done") == 50
    assert "(49 repeated warning or error lines not shown again)" in capsys.readouterr().err
    assert not any(isinstance(f, RepeatedOnce) for h in logging.getLogger().handlers for f in h.filters)
