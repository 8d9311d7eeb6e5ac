"""What one world's worker holds on the machine, in total: memory and disk (issue 32, point 6).

A process's rlimits bound each episode process (address space) and each file (size), not their sum:
three episode processes of one worker held 2.3 GB against its 2 GB limit, one call wrote 160 MB in
2,010 files, and every session's database could grow to the file size limit. cgroups would count the
sum, but where they are not ours to write (this machine: cgroup v1, mounted read-only), the parent
keeps the sums itself for each worker (`WorldTotals`; a worker serves one world, runtime/pool.py):

- **memory**: the worker's resident memory, plus what its template (strict isolation: the worker's
  one child, runtime/sandbox/template.py) holds beyond the worker's, plus for each episode process
  the anonymous memory it holds beyond the template's, which it was forked from (`/proc/<pid>/statm`:
  resident less file-backed pages; what a process shares with the template and the worker is counted
  once, in the worker). Pages a process copies on write (at most the template's own anonymous memory,
  about 15 MB) are not seen;
- **disk**: each episode's database file and journal, and its file area (every entry counted, never
  followed; bytes as allocated, so a sparse file counts what it holds);
- **processes** are counted where they are made (runtime/sandbox/processes.py, runtime/worker_handle.py).

Memory and files change only while a request runs, so an episode's figures are read again after each of
its requests (`measure`, a few microseconds: one `statm`, two `stat`s, a listing of its usually empty
file area). A call that takes its world past a limit, or writes more than a call may, is refused
(`Refusal`): the caller answers it as an env_error naming the limit and undoes it (runtime/episode.py).
Only a call whose own figure grew is refused: the other episodes go on.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from worldsmith.runtime.limits import SandboxLimits
from worldsmith.settings import env_name

_PAGE = os.sysconf("SC_PAGE_SIZE")
_MB = 1024 * 1024
#: The name of an episode's file area, as the worker draws it (128 random bits in hex).
_AREA_NAME = frozenset("0123456789abcdef")
#: The directory of a worker's scratch directory holding its episodes' databases (sandbox/records.py).
DATABASES = "databases"
#: Longer than the coarse clock file times are stamped with (a tick of the kernel's timer).
_CLOCK_TICK_NS = 50_000_000


def memory_of(pid: int) -> tuple[int, int] | None:
    """(resident, anonymous) bytes of process `pid` (anonymous: resident less file-backed), or None if it is gone."""
    try:
        fd = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fields = os.read(fd, 256).split()
    except OSError:
        return None
    finally:
        os.close(fd)
    resident = int(fields[1]) * _PAGE
    return resident, resident - int(fields[2]) * _PAGE


def children(pid: int) -> set[int] | None:
    """The pids of process `pid`'s children (None where the kernel does not list them)."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children", "rb") as handle:
            return {int(child) for child in handle.read().split()}
    except OSError:
        return None


def area_usage(path: str, most: int) -> tuple[int, int]:
    """(bytes allocated, entries) under directory `path`, nothing followed, counting stops past `most`
    entries; (0, 0) if it does not exist."""
    size = entries = 0
    pending = [path]
    while pending and entries <= most:
        try:
            listing = os.scandir(pending.pop())
        except OSError:
            continue
        with listing:
            for entry in listing:
                entries += 1
                try:
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
                    else:
                        size += entry.stat(follow_symlinks=False).st_blocks * 512
                except OSError:
                    pass
                if entries > most:
                    break
    return size, entries


def file_size(path: str) -> tuple[int, int]:
    """(bytes, 1) of the file at `path`, not followed; (0, 0) if there is none."""
    try:
        return os.lstat(path).st_size, 1
    except OSError:
        return 0, 0


@dataclass(frozen=True)
class Held:
    """What one episode holds: its process's memory (beyond the worker's), its database's bytes and
    files (the file and its journal), its file area's bytes and entries."""

    memory: int = 0
    database: int = 0
    database_files: int = 0
    area: int = 0
    area_files: int = 0

    @property
    def disk(self) -> int:
        return self.database + self.area

    @property
    def files(self) -> int:
        return self.database_files + self.area_files


@dataclass(frozen=True)
class Refusal:
    """A call refused for what it made its episode or its world hold: `limit`, and the line saying it."""

    limit: str
    error: str


@dataclass
class _Episode:
    area: str  # its file area: a directory of the worker's scratch directory
    database: str  # its database file (strict isolation; its journal beside it)
    database_limit: int  # the bytes its database may hold
    pid: int | None = None  # its process (strict isolation), while the parent knows it
    baseline: int = 0  # the worker's anonymous memory when that process was first seen
    held: Held = Held()
    # the area's status change time when it was last listed empty, and when that was (ns): unchanged
    # since well before that listing, it is empty still (an entry made or removed changes it)
    empty_since: tuple[int, int] | None = None

    def area_usage(self, most: int) -> tuple[int, int]:
        """What its file area holds (`area_usage`), listed only when it may have changed."""
        try:
            changed = os.lstat(self.area).st_ctime_ns
        except OSError:
            return 0, 0
        if self.empty_since is not None and self.empty_since[0] == changed < self.empty_since[1] - _CLOCK_TICK_NS:
            return 0, 0
        listed = time.time_ns()
        size, entries = area_usage(self.area, most)
        self.empty_since = (changed, listed) if entries == 0 else None
        return size, entries


class WorldTotals:
    """The totals of the worker `pid` with scratch directory `scratch` (its world's), against `limits`
    (memory: `memory_mb`; disk: `world_disk_mb`, `world_files`; a call: `call_files` and
    `file_size_mb`; a database: the world's bytes and `episode_db_growth_mb`). Thread-safe enough for
    its callers: each episode's entry is touched by that episode's requests only (one at a time), and
    the sums are recomputed from the entries."""

    def __init__(self, limits: SandboxLimits, scratch: Path, pid: int, *, strict: bool):
        self.limits = limits
        self.scratch = scratch
        self.pid = pid
        self.strict = strict  # episode processes, whose memory is counted, and database files (else in memory)
        self.worker_memory = 0
        self.worker_anonymous = 0
        self.template: int | None = None  # strict: the template's pid, once the worker has forked it
        self.template_anonymous = 0  # ... and its anonymous memory, which the processes it forks start with
        self._episodes: dict[str, _Episode] = {}

    # -- what the worker says ----------------------------------------------------------------
    def opened(self, episode_id: str, area: object, world_bytes: int) -> None:
        """Episode `episode_id` opened in the worker with file area `area` (its name, as the worker sent it)."""
        if isinstance(area, str) and len(area) == 32 and set(area) <= _AREA_NAME:
            self._episodes[episode_id] = _Episode(
                area=os.path.join(self.scratch, area),
                database=os.path.join(self.scratch, DATABASES, area + ".db"),
                database_limit=world_bytes + self.limits.episode_db_growth_mb * _MB,
            )

    def area(self, episode_id: str) -> Path | None:
        """Where episode `episode_id`'s file area is (None: not open in this worker)."""
        episode = self._episodes.get(episode_id)
        return Path(episode.area) if episode is not None else None

    def closed(self, episode_id: str) -> None:
        self._episodes.pop(episode_id, None)

    def process(self, episode_id: str, pid: int | None) -> None:
        """Episode `episode_id`'s process is now `pid` (None: it has none, or the parent no longer knows it)."""
        episode = self._episodes.get(episode_id)
        if episode is not None and episode.pid != pid:
            episode.pid, episode.baseline = pid, self.template_anonymous
            episode.held = replace(episode.held, memory=0)

    def measure_worker(self) -> None:
        """Read the worker's and its template's memory again (after one of the worker's requests; strict
        isolation: under fast isolation its episodes share it, and its address space limit bounds it).
        The template is the worker's one child, forked when its environment was loaded; found once."""
        if not self.strict:
            return
        self.worker_memory, self.worker_anonymous = memory_of(self.pid) or (0, 0)
        if self.template is None:
            forked = children(self.pid)
            if forked is not None and len(forked) == 1:
                self.template = next(iter(forked))
        if self.template is not None:
            self.template_anonymous = (memory_of(self.template) or (0, 0))[1]

    # -- totals ---------------------------------------------------------------------------------
    @property
    def memory(self) -> int:
        template = max(0, self.template_anonymous - self.worker_anonymous)  # what it does not share with the worker
        return self.worker_memory + template + sum(e.held.memory for e in list(self._episodes.values()))

    @property
    def disk(self) -> int:
        return sum(e.held.disk for e in list(self._episodes.values()))

    @property
    def files(self) -> int:
        return sum(e.held.files for e in list(self._episodes.values()))

    def measure(self, episode_id: str, *, call: bool) -> Refusal | None:
        """Read again what episode `episode_id` holds, after one of its requests; for a `call`, the
        Refusal when it wrote more than a call may or took its world past a limit it grew towards."""
        episode = self._episodes.get(episode_id)
        if episode is None:
            return None
        before = episode.held
        limits = self.limits
        memory = db_bytes = db_files = journal_bytes = journal_files = 0
        if self.strict:
            measured = memory_of(episode.pid) if episode.pid is not None else None
            if measured is None:
                episode.pid = None
            else:
                memory = max(0, measured[1] - episode.baseline)
            db_bytes, db_files = file_size(episode.database)
            journal_bytes, journal_files = file_size(episode.database + "-journal")
        area, area_files = episode.area_usage(limits.world_files)
        held = episode.held = Held(memory, db_bytes + journal_bytes, db_files + journal_files, area, area_files)
        if not call:
            return None
        if held.area_files - before.area_files > limits.call_files:
            return Refusal(
                "call_files",
                f"sandbox limit call_files: the call left {held.area_files - before.area_files} new files in its "
                f"episode's file area, more than the {limits.call_files} a call may ({env_name('sandbox_call_files')})",
            )
        if held.area - before.area > limits.file_size_mb * _MB:
            return Refusal(
                "call_size",
                f"sandbox limit call_size: the call wrote {_mb(held.area - before.area)} in its episode's file area, "
                f"more than the {limits.file_size_mb} MB a call may ({env_name('sandbox_file_size_mb')})",
            )
        if db_bytes > episode.database_limit:
            return Refusal(
                "database_size",
                f"sandbox limit database_size: the episode's database holds {_mb(db_bytes)}, more than the "
                f"{_mb(episode.database_limit)} it may (its world's and {env_name('sandbox_episode_db_growth_mb')})",
            )
        if held.memory > before.memory and self.memory > limits.memory_mb * _MB and self._still_over():
            return Refusal(
                "world_memory",
                f"sandbox limit world_memory: the call took its world's processes to {_mb(self.memory)}, more than "
                f"the {limits.memory_mb} MB they may hold together ({env_name('sandbox_memory_mb')}); "
                "its episode process was stopped",
            )
        if held.disk > before.disk and self.disk > limits.world_disk_mb * _MB:
            return Refusal(
                "world_disk",
                f"sandbox limit world_disk: the call took its world's episodes to {_mb(self.disk)} on disk, more "
                f"than the {limits.world_disk_mb} MB they may hold together ({env_name('sandbox_world_disk_mb')})",
            )
        if held.files > before.files and self.files > limits.world_files:
            return Refusal(
                "world_files",
                f"sandbox limit world_files: the call took its world's episodes to {self.files} files, more than "
                f"the {limits.world_files} they may hold together ({env_name('sandbox_world_files')})",
            )
        return None

    def _still_over(self) -> bool:
        """Whether the memory total is over its limit once processes the worker stopped by itself (the
        least recently used, past the process cap) are no longer counted."""
        alive = children(self.template if self.template is not None else self.pid)
        if alive is not None:
            for episode in list(self._episodes.values()):
                if episode.pid is not None and episode.pid not in alive:
                    episode.pid, episode.held = None, replace(episode.held, memory=0)
        return self.memory > self.limits.memory_mb * _MB


def _mb(size: int) -> str:
    return f"{size / _MB:.1f} MB"
