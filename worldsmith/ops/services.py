"""Long-running local services (the Prefect server, workers, the dashboard) as detached processes.

Each service has a pid file and a log file under `WORLDSMITH_HOME/run/`. Starting one that is
already running does nothing (so `worldsmith up` is idempotent); a pid file whose process is gone
or is some other program is stale and ignored. Starting waits until the service says it is ready,
and a service that dies while starting raises an error with the end of its log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from worldsmith.errors import WorldsmithError


class ServiceError(WorldsmithError, RuntimeError):
    """A service did not start or stop."""


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file ('' when there is none)."""
    if not path.is_file():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _contains(cmdline: list[str], signature: list[str]) -> bool:
    """Whether `signature` occurs in `cmdline` as consecutive arguments."""
    n = len(signature)
    return any(cmdline[i : i + n] == signature for i in range(len(cmdline) - n + 1))


@dataclass
class Service:
    """One detached process: `command` run with `env`, ready when `ready()` says so."""

    name: str
    command: list[str]
    run_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    ready: Callable[[], bool] = lambda: True
    start_timeout_s: float = 90.0
    #: Arguments that identify the running service in a process's command line (default: all but
    #: the interpreter), so a changed port or address setting still finds it and a reused pid does not.
    signature: list[str] | None = None

    @property
    def pid_file(self) -> Path:
        return self.run_dir / f"{self.name}.pid"

    @property
    def log_file(self) -> Path:
        return self.run_dir / f"{self.name}.log"

    def pid(self) -> int | None:
        """The pid of the running service, or None (no pid file, a dead process or a reused pid)."""
        try:
            pid = int(self.pid_file.read_text().split()[0])
            process = psutil.Process(pid)
            if process.status() == psutil.STATUS_ZOMBIE or not _contains(
                process.cmdline(), self.signature or self.command[1:]
            ):
                return None
            return pid
        except (FileNotFoundError, ValueError, IndexError, psutil.Error):
            return None

    def start(self) -> bool:
        """Start the service unless it runs; wait until it is ready. Returns True when it was started."""
        if self.pid() is not None:
            if not self.ready():
                self._wait_ready(self.pid())
            return False
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_file, "ab") as log:
            process = subprocess.Popen(
                self.command,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                start_new_session=True,
            )
        self.pid_file.write_text(f"{process.pid}\n")
        self._wait_ready(process.pid, process)
        return True

    def _wait_ready(self, pid: int | None, process: subprocess.Popen[bytes] | None = None) -> None:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process is not None and process.poll() is not None or process is None and self.pid() != pid:
                self.pid_file.unlink(missing_ok=True)
                raise ServiceError(
                    f"{self.name} exited while starting; end of {self.log_file}:\n{log_tail(self.log_file)}"
                )
            if self.ready():
                return
            time.sleep(0.5)
        self.stop()
        raise ServiceError(
            f"{self.name} was not ready after {self.start_timeout_s:.0f} s (stopped it); end of {self.log_file}:\n"
            f"{log_tail(self.log_file)}"
        )

    def stop(self, timeout_s: float = 20.0) -> bool:
        """Stop the service and its children (SIGTERM, then SIGKILL). Returns True when one was running."""
        pid = self.pid()
        self.pid_file.unlink(missing_ok=True)
        if pid is None:
            return False
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            return True
        try:
            psutil.Process(pid).wait(timeout_s)
        except (psutil.TimeoutExpired, psutil.NoSuchProcess):
            pass
        try:
            os.killpg(pid, signal.SIGKILL)  # what is left of the group: a hung leader, or children it left behind
        except ProcessLookupError:
            pass
        return True
