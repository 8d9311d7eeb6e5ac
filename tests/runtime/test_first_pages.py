"""The pages a first call writes, read from /proc and written ahead (runtime/sandbox/firstpages.py).

A private anonymous mapping is made and touched here, then a child is forked: the child shares its
pages until it writes one. What the module must get right: which of the child's pages it holds alone
(the ones it wrote, none of those it only shares), within a limit; and a process making pages its own
ahead without changing them, stopping when told.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import signal

import pytest

from worldsmith.runtime.sandbox import firstpages

PAGES = 64


@pytest.fixture
def shared():
    """A private anonymous mapping of PAGES pages, each written once here (present, so a fork shares it);
    its first page number."""
    area = mmap.mmap(-1, PAGES * firstpages.PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    area.write(b"x" * len(area))
    first = ctypes.addressof(ctypes.c_char.from_buffer(area)) // firstpages.PAGE
    yield area, first
    area.close()


def _child(work) -> int:
    """Fork a child that runs `work`, then says so on a pipe and waits to be killed; its pid, once it said so."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read)
            work()
            os.write(write, b"1")
            signal.pause()
        finally:
            os._exit(0)
    os.close(write)
    assert os.read(read, 1) == b"1"
    os.close(read)
    return pid


def _written_by(work) -> set[int]:
    """The pages a child running `work` holds alone, as `written_pages` reads them."""
    pid = _child(work)
    try:
        return _pages(firstpages.written_pages(pid, grandparent=os.getppid(), limit=1 << 20))
    finally:
        _end(pid)


def _pages(packed: bytes) -> set[int]:
    return {page for first, count in firstpages.ranges(packed, limit=1 << 40) for page in range(first, first + count)}


def _end(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


@pytest.mark.sandbox  # forks a child
def test_the_pages_a_child_wrote_are_named_and_those_it_shares_are_not(shared):
    area, first = shared

    def write_some() -> None:
        for page in range(8, 16):
            area[page * firstpages.PAGE] = ord("y")

    found = _written_by(write_some)
    assert set(range(first + 8, first + 16)) <= found
    assert not found & set(range(first + 16, first + PAGES))  # shared with this process: not the child's own


@pytest.mark.sandbox  # forks a child
def test_written_pages_stop_at_their_limit_and_a_gone_process_has_none(shared):
    area, _ = shared

    def write_all() -> None:
        area[:] = b"z" * len(area)

    pid = _child(write_all)
    try:
        assert (
            sum(
                count
                for _, count in firstpages.ranges(firstpages.written_pages(pid, grandparent=os.getppid(), limit=5))
            )
            == 5
        )
    finally:
        _end(pid)
    assert firstpages.written_pages(pid, grandparent=os.getppid()) == b""


@pytest.mark.unit
def test_ranges_refuse_what_is_no_list_of_ranges_and_cut_at_the_limit():
    with pytest.raises(ValueError, match="not a whole number"):
        firstpages.ranges(b"\x00" * (firstpages.RANGE.size + 3))
    with pytest.raises(ValueError, match="past the address space"):
        firstpages.ranges(firstpages.pack([(1 << 52, 1)]))
    packed = firstpages.pack([(100, 10), (150, 0), (200, 10)])
    assert firstpages.ranges(packed, limit=15) == [(100, 10), (200, 5)]  # the empty one dropped


@pytest.mark.sandbox  # forks a child
def test_only_a_grandchild_of_the_one_named_is_read(shared):
    """The parent reads a probe only if it is its worker's template's child: a pid taken since by
    another process is never read."""
    area, _ = shared

    def write_all() -> None:
        area[:] = b"w" * len(area)

    pid = _child(write_all)
    try:
        assert firstpages.written_pages(pid, grandparent=os.getppid()) != b""
        assert firstpages.written_pages(pid, grandparent=os.getpid()) == b""  # its parent, not its grandparent
        assert firstpages.written_pages(True, grandparent=os.getppid()) == b""  # not a pid
    finally:
        _end(pid)


@pytest.mark.sandbox  # forks a child
def test_a_process_makes_pages_its_own_ahead_without_changing_them_and_stops_when_told(shared):
    area, first = shared
    wanted = firstpages.RANGE.pack(first + 4, 20)
    assert firstpages.write_ahead(wanted, stop=lambda: True) == 0

    def ahead() -> None:
        assert firstpages.write_ahead(wanted, stop=lambda: False) == 20
        assert area[:] == b"x" * len(area)  # contents unchanged

    found = _written_by(ahead)
    assert set(range(first + 4, first + 24)) <= found
    assert not found & set(range(first + 24, first + PAGES))
