"""Sandbox limits for tests: tight ones so hostile code ends fast, patient ones so load never turns a
well-behaved call into a timeout, and the isolation modes hostile tests run in."""

from __future__ import annotations

import dataclasses
import os

from support.patience import MOMENTS_S
from worldsmith.runtime.limits import SandboxLimits

#: Tight limits so hostile tests finish quickly.
FAST_LIMITS = SandboxLimits(call_timeout_s=2.0, cpu_s=1.0, memory_mb=512, file_size_mb=1, grace_s=2.0)
#: FAST_LIMITS with time limits that no well-behaved tool or verifier call comes near however busy
#: the machine is: a call of milliseconds is never turned into a timeout by load.
PATIENT_LIMITS = dataclasses.replace(FAST_LIMITS, call_timeout_s=MOMENTS_S, cpu_s=MOMENTS_S / 2)
#: The sandbox's isolation modes (docs/security.md): hostile tests run in each.
ISOLATIONS = ("strict", "fast")


def isolated(limits: SandboxLimits, mode: str) -> SandboxLimits:
    return dataclasses.replace(limits, isolation=mode)


def code_process(episode) -> int | None:
    """The pid of the process that runs `episode`'s tool code now: under strict isolation its own
    process (None until its next call when it has none), under fast isolation its worker (None once
    the worker is gone)."""
    worker = episode._worker
    if worker.limits.isolation == "fast":
        return worker.pid if worker.alive else None
    reply, _ = worker.request({"op": "ping"}, timeout=MOMENTS_S)
    return reply["processes"].get(episode.id)


def database_file(episode) -> str:
    """The database file episode's process holds open (strict isolation; it made a call or is a spare's)."""
    pid = code_process(episode)
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.endswith(".db") and os.path.basename(os.path.dirname(target)) == "databases":
            return target
    raise AssertionError(f"episode {episode.id} holds no database open")


def file_area(episode) -> str:
    """The episode's file area, beside its database's directory (strict isolation)."""
    database = database_file(episode)
    return os.path.join(os.path.dirname(os.path.dirname(database)), os.path.basename(database)[: -len(".db")])
