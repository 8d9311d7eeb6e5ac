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


def _library_output() -> None:
    """What training prints through the libraries: a FutureWarning, a transformers log line, progress bars."""
    import warnings

    from datasets import Dataset
    from transformers.utils import logging as transformers_logging

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn(
            "`is_gradient_checkpointing` is deprecated and will be removed in v6", FutureWarning, stacklevel=1
        )
    transformers_logging.get_logger("transformers.modeling_utils").warning("a transformers line")
    for _ in transformers_logging.tqdm(range(3), desc="Loading weights"):
        pass
    Dataset.from_dict({"a": [1, 2]}).map(lambda row: row, desc="Tokenizing train dataset")


def test_a_training_command_keeps_the_libraries_output_in_the_log_file(home, terminal, monkeypatch, capfd):
    from transformers.utils import logging as transformers_logging

    monkeypatch.setitem(run_log.VERBOSE, "on", False)
    with flow_logs("train", libraries=True) as path:
        _library_output()
    printed = capfd.readouterr()
    shown = printed.out + printed.err + terminal.getvalue()
    assert [line for line in shown.splitlines() if line.strip()] == [f"log: {path}"], shown  # only the log file
    logged = path.read_text()
    assert "FutureWarning" in logged and "is_gradient_checkpointing" in logged and "a transformers line" in logged
    assert transformers_logging.is_progress_bar_enabled()  # as it was once the command ended


def test_a_training_command_with_verbose_shows_the_libraries_output(home, terminal, monkeypatch, capfd):
    monkeypatch.setitem(run_log.VERBOSE, "on", True)
    with flow_logs("train", libraries=True):
        _library_output()
    printed = capfd.readouterr()
    shown = printed.out + printed.err + terminal.getvalue()
    assert "Loading weights" in shown and "is_gradient_checkpointing" in shown and "a transformers line" in shown
