"""The process that runs a catalog run (an evaluation or a training run), recorded in the run's
metrics as `process`, and whether it still runs: so a run that reads `running` after its process
died is told apart, and a run still in progress is not resumed twice."""

from __future__ import annotations

import os
import socket

import psutil

from worldsmith.jsonvalue import JsonObject, JsonValue


def this_process() -> JsonObject:
    """The process running a run: {"host", "pid", "started"}, its host, pid and start time (a pid is
    reused, the pair is not)."""
    return {"host": socket.gethostname(), "pid": os.getpid(), "started": psutil.Process().create_time()}


def process_alive(owner: JsonValue) -> bool | None:
    """Whether the process `owner` (from `this_process`, as a run's metrics hold it) still runs: True or
    False when it ran on this host, None when it ran on another host or none was recorded."""
    if not isinstance(owner, dict) or owner.get("host") != socket.gethostname():
        return None
    pid = owner["pid"]
    if not isinstance(pid, int):
        raise TypeError(f"a run's process id is a number, not {pid!r}")
    try:
        same: bool = psutil.Process(pid).create_time() == owner["started"]
        return same
    except psutil.NoSuchProcess:
        return False
