"""Quiet by default: the log lines of the flow runs a command starts go to a log file, not the terminal.

A command that runs a flow (`generate`, `eval`, `train`...) prints its progress bars, its results and
its one-line answer; Prefect's own lines (each task run's state, each failure, once per task: an
endpoint refusing the key printed the same 401 two hundred times) go to a file under
WORLDSMITH_HOME/logs, named on stderr at the end, and to the Prefect UI as before (its API handler is
untouched). `worldsmith --verbose COMMAND` shows them on the terminal as well, a warning or error
repeated (the same message from task after task) once, with the count of repeats at the end.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from worldsmith.cli.console import errors
from worldsmith.settings import get_settings

#: Set by the root option `--verbose`: Prefect's log lines stay on the terminal too.
VERBOSE = {"on": False}


class RepeatedOnce(logging.Filter):
    """On the terminal's handler: a warning or error whose message was printed already is not printed
    again, only counted (`repeats`); everything else passes."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()
        self.repeats = 0

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        message = record.getMessage()
        if message in self.seen:
            self.repeats += 1
            return False
        self.seen.add(message)
        return True


def log_path(command: str) -> Path:
    """A new log file's path for one run of `command`: WORLDSMITH_HOME/logs/<command>-<time>-<pid>.log."""
    folder = get_settings().home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{command}-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.log"


@contextmanager
def flow_logs(command: str, announce: bool = True) -> Iterator[Path]:
    """Inside, Prefect's log lines (those its console handler on the root logger would print) go to a
    new log file, and to the terminal only with `--verbose`; on leaving, the console handler is back and
    the file, once written, is named on stderr (unless not `announce`: output for machines, `--json`).
    Imports Prefect (its logging set up first, as the flow's import would)."""
    import prefect  # noqa: F401 - sets up Prefect's logging, whose console handler is taken off below
    from prefect.logging.handlers import PrefectConsoleHandler

    root = logging.getLogger()
    consoles = [h for h in root.handlers if isinstance(h, PrefectConsoleHandler)]
    path = log_path(command)
    to_file = logging.FileHandler(path, encoding="utf-8", delay=True)
    if consoles and consoles[0].formatter is not None:
        to_file.setFormatter(consoles[0].formatter)
    quiet = not VERBOSE["on"]
    once = {handler: RepeatedOnce() for handler in consoles}  # a handler's own: each prints once
    for handler in consoles:
        if quiet:
            root.removeHandler(handler)
        else:
            handler.addFilter(once[handler])
    root.addHandler(to_file)
    try:
        yield path
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler in consoles:
            if quiet:
                root.addHandler(handler)
            else:
                handler.removeFilter(once[handler])
        repeats = max((f.repeats for f in once.values()), default=0)
        if repeats:
            errors.print(f"({repeats} repeated warning or error lines not shown again)", markup=False)
        if announce and path.exists():
            errors.print(f"log: {path}", markup=False, highlight=False, soft_wrap=True)
