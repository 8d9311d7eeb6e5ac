"""What Prefect's console handler prints in a test (quiet by default: cli/run_log.py)."""

from __future__ import annotations

import io
import logging

import pytest
from rich.console import Console


def prefect_console(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """What Prefect's console handler (on the root logger) prints from now on, in this test."""
    from prefect.logging.handlers import PrefectConsoleHandler

    stream = io.StringIO()
    for handler in logging.getLogger().handlers:
        if isinstance(handler, PrefectConsoleHandler):
            monkeypatch.setattr(handler, "stream", stream)
            monkeypatch.setattr(handler, "console", Console(file=stream, width=200))
    return stream
