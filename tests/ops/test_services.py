"""Detached local services (ops/services.py): idempotent start, readiness, stale pid files, stop."""

from __future__ import annotations

import os
import sys

import psutil
import pytest
from support.patience import PROCESS_S

from worldsmith.ops.services import Service, ServiceError

pytestmark = pytest.mark.e2e

#: A process that runs until it is stopped.
FOREVER = "import threading; threading.Event().wait()"
SLEEPER = f"import pathlib, sys; pathlib.Path(sys.argv[1]).write_text('up'); print('serving', flush=True); {FOREVER}"


def sleeper(tmp_path, name: str = "sleeper") -> Service:
    ready_file = tmp_path / f"{name}.ready"
    return Service(
        name,
        [sys.executable, "-c", SLEEPER, str(ready_file)],
        tmp_path / "run",
        ready=ready_file.exists,
        start_timeout_s=PROCESS_S,
    )


def test_a_service_starts_once_when_ready_then_stops_for_good(tmp_path):
    service = sleeper(tmp_path)
    assert service.start() is True
    pid = service.pid()
    assert pid is not None and psutil.pid_exists(pid)
    assert service.start() is False and service.pid() == pid  # already running: nothing started
    assert "serving" in service.log_file.read_text()
    assert service.stop() is True
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    assert service.pid() is None and not service.pid_file.exists() and service.stop() is False


def test_a_service_that_dies_while_starting_reports_its_log(tmp_path):
    broken = Service(
        "broken",
        [sys.executable, "-c", "import sys; print('bad configuration: port taken'); sys.exit(3)"],
        tmp_path / "run",
        ready=lambda: False,
        start_timeout_s=PROCESS_S,
    )
    with pytest.raises(ServiceError, match="broken exited while starting(.|\n)*bad configuration: port taken"):
        broken.start()
    assert broken.pid() is None and not broken.pid_file.exists()


def test_a_service_never_ready_is_stopped_after_the_timeout(tmp_path):
    hung = Service(
        "hung",
        [sys.executable, "-c", FOREVER],
        tmp_path / "run",
        ready=lambda: False,
        start_timeout_s=1.5,  # the limit under test
    )
    with pytest.raises(ServiceError, match="not ready after 2 s"):
        hung.start()
    assert hung.pid() is None


def test_stale_or_foreign_pid_files_are_ignored(tmp_path):
    service = sleeper(tmp_path)
    service.run_dir.mkdir(parents=True)
    service.pid_file.write_text(f"{os.getpid()}\n")  # a live process that is not this service (pytest itself)
    assert service.pid() is None
    service.pid_file.write_text("999999999\n")  # no such process
    assert service.pid() is None
    service.pid_file.write_text("not a pid\n")
    assert service.pid() is None
    assert service.start() is True and service.pid() is not None  # the stale file does not block a start
    service.stop()
