"""The pages an episode's first call writes, made a spare's own before any episode claims it (issue 32).

A process forked from the template shares the template's pages until it writes one (copy-on-write):
an imported app's first request writes a few thousand (reference counts and caches of the code and
objects it touches), each a page fault, several milliseconds of a first call that a second call does
not pay. Which pages is a property of the world's app, not of any episode, so it is learned once per
world, from a *probe*: a process forked like a spare (confined to a fresh directory with its own
database, holding no episode, never claimed) that makes one stand-in call per tool and then waits. The
parent, outside the sandbox, reads from /proc which pages of the probe's private writable mappings it
now holds alone (`written_pages`: the kernel's answer, nothing the probe's code says), and the worker
passes them to each spare it forks, which writes them ahead (`write_ahead`: MADV_POPULATE_WRITE, the
contents unchanged) once it is ready and unclaimed, as its warm-up does. At most `MAX_PAGES` per
spare. Stdlib only (the sandbox worker imports it)."""

from __future__ import annotations

import ctypes
import os
import struct
from array import array
from collections.abc import Callable, Iterable

#: The memory page size.
PAGE = os.sysconf("SC_PAGE_SIZE")
#: At most this many pages (16 MiB of 4 KiB pages) a spare makes its own ahead.
MAX_PAGES = 4096
#: A mapping larger than this is not read (an allocator's reservation, not the pages a call writes).
MAX_MAPPING = 1 << 30
#: Page-map entries read from one process at most (8 MiB of them): what the parent spends on a probe is bounded.
MAX_ENTRIES = 1 << 20
#: Pages a spare makes its own between two looks at its pipe (about a millisecond).
CHUNK = 128
#: A range of pages: its first page number and how many pages.
RANGE = struct.Struct("=QQ")

# /proc/PID/pagemap: the page is present; a file's page (an unwritten page of a private file mapping); mapped
# by this process alone
_PRESENT, _FILE, _EXCLUSIVE = 1 << 63, 1 << 61, 1 << 56
#: Page numbers end below this (64-bit addresses).
_END = 1 << 52
_MADV_POPULATE_WRITE = 23  # Linux 5.14: fault pages in writable, as a write would, without writing

_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
_libc.madvise.restype = ctypes.c_int


def written_pages(pid: int, grandparent: int, limit: int = MAX_PAGES) -> bytes:
    """The anonymous pages of process `pid`'s private writable mappings that it holds alone (present
    and mapped once: written since it was forked, or first touched by it), as `RANGE`s in address
    order, at most `limit` pages, among the first `MAX_ENTRIES` pages of those mappings; b"" where
    /proc does not say (the process is gone, or this one may not read its page map) or where `pid` is
    not a grandchild of `grandparent` (a probe is the child of a worker's template: a pid reused by
    another process is never read, its files opened through the one directory of the process checked)."""
    if isinstance(pid, bool) or pid <= 1:
        return b""
    try:
        directory = os.open(f"/proc/{pid}", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return b""
    try:
        if _parent(_parent(pid, directory)) != grandparent:
            return b""
        with (
            open("maps", opener=lambda name, flags: os.open(name, flags, dir_fd=directory)) as maps,
            open(
                "pagemap", "rb", buffering=0, opener=lambda name, flags: os.open(name, flags, dir_fd=directory)
            ) as pagemap,
        ):
            return pack(_alone(maps, pagemap.fileno(), limit))
    except (OSError, ValueError):
        return b""
    finally:
        os.close(directory)


def _parent(pid: int, directory: int | None = None) -> int:
    """The parent's pid of process `pid` (its /proc directory open as `directory`, if given); 0 if gone."""
    try:
        if directory is None:
            with open(f"/proc/{pid}/stat", "rb") as handle:
                stat = handle.read()
        else:
            fd = os.open("stat", os.O_RDONLY | os.O_CLOEXEC, dir_fd=directory)
            try:
                stat = os.read(fd, 4096)
            finally:
                os.close(fd)
    except OSError:
        return 0
    return int(stat.rsplit(b")", 1)[1].split()[1])  # after the name: state, ppid


def _alone(maps: Iterable[str], pagemap: int, limit: int) -> list[tuple[int, int]]:
    """The ranges of anonymous pages held alone in the private writable mappings `maps` lists, read
    from the page map `pagemap` (`written_pages`)."""
    found: list[tuple[int, int]] = []
    left, budget = limit, MAX_ENTRIES
    for first, whole in (r for r in map(_region, maps) if r is not None):
        count = min(whole, budget)
        budget -= count
        entries = array("Q")
        entries.frombytes(os.pread(pagemap, count * 8, first * 8))
        for index, entry in enumerate(entries):
            if entry & _PRESENT and entry & _EXCLUSIVE and not entry & _FILE:
                _add(found, first + index)
                left -= 1
                if left == 0:
                    return found
        if budget == 0:
            break
    return found


def _region(line: str) -> tuple[int, int] | None:
    """(first page, pages) of a /proc/PID/maps line if it is a private writable mapping of a sensible
    size, else None."""
    fields = line.split()
    span, perms = fields[0], fields[1]
    if perms[1] != "w" or perms[3] != "p":
        return None
    low, high = (int(address, 16) for address in span.split("-"))
    if high - low > MAX_MAPPING:
        return None
    return low // PAGE, (high - low) // PAGE


def _add(found: list[tuple[int, int]], page: int) -> None:
    """Add `page` to the ranges `found` (pages come in ascending order)."""
    if found and sum(found[-1]) == page:
        found[-1] = (found[-1][0], found[-1][1] + 1)
    else:
        found.append((page, 1))


def pack(ranges: Iterable[tuple[int, int]]) -> bytes:
    """Page ranges as `written_pages` writes them (`RANGE` each)."""
    return b"".join(RANGE.pack(first, count) for first, count in ranges)


def ranges(packed: bytes, limit: int = MAX_PAGES) -> list[tuple[int, int]]:
    """The ranges of `packed` (as `pack` writes them), cut at `limit` pages in all (empty ranges
    dropped). ValueError if it is not a whole number of ranges or a range ends past 64-bit addresses."""
    if len(packed) % RANGE.size:
        raise ValueError(f"page ranges: {len(packed)} bytes is not a whole number of {RANGE.size}-byte ranges")
    out: list[tuple[int, int]] = []
    left = limit
    for first, count in RANGE.iter_unpack(packed):
        if first + count > _END:
            raise ValueError(f"page ranges: pages {first}+{count} end past the address space")
        if left <= 0:
            break
        if count:
            out.append((first, min(count, left)))
            left -= out[-1][1]
    return out


def write_ahead(packed: bytes, stop: Callable[[], bool]) -> int:
    """In a spare: make the pages of `packed` this process's own now, without changing their contents
    (a range no longer mapped here, or not writable, is skipped), a `CHUNK` at a time until `stop()`
    says an episode has claimed it (its first call then waits for no more than a chunk). Returns the
    pages done."""
    done = 0
    for first, count in ranges(packed):
        for start in range(first, first + count, CHUNK):
            if stop():
                return done
            pages = min(CHUNK, first + count - start)
            if _libc.madvise(start * PAGE, pages * PAGE, _MADV_POPULATE_WRITE) == 0:
                done += pages
    return done
