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
    #: strict isolation: processes a worker forks ahead of its episodes (started, database open, confined:
    #: an episode's first call skips that), counted in `episode_processes`; 0: none
    spare_processes: int = 2
    #: strict isolation, an imported app: spares write ahead the pages its first call writes, learned once per
    #: world by a probe (runtime/sandbox/firstpages.py; up to 16 MiB more per episode process)
    first_pages: bool = True
    #: strict isolation, an imported app: the template makes one request to each GET route before it forks,
    #: if a trial shows the app keeps nothing of them (runtime/sandbox/standin.py); false: none
    stand_in_reads: bool = True
    #: files a call may open for writing in its episode's file area (its bytes there: at most `file_size_mb`)
    call_files: int = 64
    #: how much an episode's database may grow beyond its world's (SQLite's max_page_count)
    episode_db_growth_mb: int = 8
    #: what one worker's episodes (one world's) hold on disk together: bytes, and files (runtime/totals.py);
    #: memory: the worker and its episode processes together hold at most `memory_mb`
    world_disk_mb: int = 4096
    world_files: int = 65536

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
            spare_processes=s.sandbox_spare_processes,
            first_pages=s.sandbox_first_pages,
            stand_in_reads=s.sandbox_stand_in_reads,
            call_files=s.sandbox_call_files,
            episode_db_growth_mb=s.sandbox_episode_db_growth_mb,
            world_disk_mb=s.sandbox_world_disk_mb,
            world_files=s.sandbox_world_files,
        )
