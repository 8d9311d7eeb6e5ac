"""Quiet by default: the log lines of the flow runs a command starts go to a log file, not the terminal.

A command that runs a flow (`generate`, `eval`, `train`...) prints its progress bars, its results and
its one-line answer; Prefect's own lines (each task run's state, each failure, once per task: an
endpoint refusing the key printed the same 401 two hundred times) go to a file under
WORLDSMITH_HOME/logs, named on stderr at the end, and to the Prefect UI as before (its API handler is
untouched). `worldsmith --verbose COMMAND` shows them on the terminal as well, a warning or error
repeated (the same message from task after task) once, with the count of repeats at the end.

The commands that train (`train`, `resume`, `cotrain`, `wm train`) quiet the machine-learning libraries
too (`library_logs`): Python's warnings (transformers' FutureWarnings) and the libraries' log lines go to the
same log file, on the terminal only with `--verbose`, and Hugging Face's progress bars are drawn only then.
"""

from __future__ import annotations

import importlib
import logging
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
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


class PrefectInfoAfterwards(logging.Filter):
    """On the terminal's handler once a quiet command's flows ended: Prefect's own lines below a warning
    (the temporary server's "Stopping temporary server" as the process exits) are not printed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.WARNING or not record.name.startswith("prefect")


_AFTERWARDS = PrefectInfoAfterwards()


def _log_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: object = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` inside `library_logs`: the warning as a log record of `py.warnings` (what
    `logging.captureWarnings` does, set here whatever another library left that switch at)."""
    logging.getLogger("py.warnings").warning("%s", warnings.formatwarning(message, category, filename, lineno, line))


@contextmanager
def library_logs(bars: bool) -> Iterator[None]:
    """Inside, Python's warnings and the transformers library's log lines reach the root logger's handlers
    (the log file of `flow_logs`, and the terminal with `--verbose`) instead of stderr, and unless `bars`
    the Hugging Face libraries draw no progress bar; on leaving, all as it was. Imports transformers,
    datasets and huggingface_hub (a training command's)."""
    import datasets

    hub_bars = importlib.import_module("huggingface_hub.utils.tqdm")  # its package names a class tqdm too
    from transformers.utils import logging as transformers_logging

    hf_bars: tuple[tuple[Callable[[], bool], Callable[[], object], Callable[[], object]], ...] = (
        (
            lambda: hub_bars.are_progress_bars_disabled(),
            lambda: hub_bars.disable_progress_bars(),
            lambda: hub_bars.enable_progress_bars(),
        ),
        (
            lambda: not transformers_logging.is_progress_bar_enabled(),
            transformers_logging.disable_progress_bar,
            transformers_logging.enable_progress_bar,
        ),
        (
            lambda: not datasets.is_progress_bar_enabled(),
            datasets.disable_progress_bars,
            datasets.enable_progress_bars,
        ),
    )
    progress = () if bars else hf_bars
    were_off = [off() for off, _, _ in progress]
    for _, disable, _ in progress:
        disable()
    shown = warnings.showwarning
    warnings.showwarning = _log_warning
    transformers_logging.disable_default_handler()
    transformers_logging.enable_propagation()
    try:
        yield
    finally:
        transformers_logging.disable_propagation()
        transformers_logging.enable_default_handler()
        warnings.showwarning = shown
        for was_off, (_, _, enable) in zip(were_off, progress, strict=True):
            if not was_off:
                enable()


@contextmanager
def flow_logs(command: str, announce: bool = True, libraries: bool = False) -> Iterator[Path]:
    """Inside, Prefect's log lines (those its console handler on the root logger would print) go to a
    new log file, and to the terminal only with `--verbose`; on leaving, the console handler is back
    (Prefect's own lines below a warning not printed on it afterwards) and the file, once written, is
    named on stderr (unless not `announce`: output for machines, `--json`). With `libraries` (a training
    command), the libraries' warnings and log lines go the same way, their progress bars drawn only with
    `--verbose` (`library_logs`). Imports Prefect (its
    logging set up first, as the flow's import would)."""
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
        with library_logs(bars=not quiet) if libraries else nullcontext():
            yield path
    finally:
        root.removeHandler(to_file)
        to_file.close()
        for handler in consoles:
            if quiet:
                root.addHandler(handler)
                handler.addFilter(_AFTERWARDS)
            else:
                handler.removeFilter(once[handler])
        repeats = max((f.repeats for f in once.values()), default=0)
        if repeats:
            errors.print(f"({repeats} repeated warning or error lines not shown again)", markup=False)
        if announce and path.exists():
            errors.print(f"log: {path}", markup=False, highlight=False, soft_wrap=True)
