"""The limits of every sandbox call and worker, and how episodes share a worker (`isolation`).

A frozen value: the pool, its workers and the worker processes read it, nothing changes it. Its
numbers are what docs/security.md promises; `from_settings` takes them from the settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from worldsmith.settings import Settings, get_settings

Isolation = Literal["strict", "fast"]


@dataclass(frozen=True)
class SandboxLimits:
    """Limits of every call and worker (see docs/security.md)."""

    call_timeout_s: float = 5.0
    cpu_s: float = 5.0
    memory_mb: int = 2048
    file_size_mb: int = 16
    uid: int = 65534
    lifetime_cpu_s: int = 3600
    grace_s: float = 2.0
    start_timeout_s: float = 30.0
    #: "strict": each request that runs generated code in its own process forked from the worker;
    #: "fast": episodes of one environment share their worker's interpreter (vetted worlds only).
    isolation: Isolation = "strict"
    #: strict isolation: episode processes a worker keeps between calls (the least recently used goes first);
    #: below the sessions a worker serves, every call forks again (128 sessions on 2 workers kept 32 each: x8 slower)
    episode_processes: int = 128

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> SandboxLimits:
        s = settings or get_settings()
        return cls(
            call_timeout_s=s.sandbox_call_timeout_s,
            cpu_s=s.sandbox_cpu_s,
            memory_mb=s.sandbox_memory_mb,
            file_size_mb=s.sandbox_file_size_mb,
            uid=s.sandbox_uid,
            isolation=s.sandbox_isolation,
            episode_processes=s.sandbox_episode_processes,
        )
