"""Spares: episode processes forked ahead per world (runtime/sandbox/processes.py, issue 32).

A worker under strict isolation keeps `spare_processes` processes forked from its template before
any episode asks, each confined to a fresh directory of its own with its database open; an episode
opened afresh takes one. What must hold (docs/security.md, "Spares"): a world's spares count against
its own process cap and no other world's, a spare serves one episode and goes with it (never handed
to another, never reused), each starts from the world (nothing of an episode before it), and they go
with their world's worker.
"""

from __future__ import annotations

import dataclasses
import os
import select
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.bundles import with_tools
from support.limits import PATIENT_LIMITS, code_process, database_file, isolated
from support.patience import MOMENTS_S

from worldsmith.runtime.episode import Runtime

pytestmark = pytest.mark.sandbox

BUSY = textwrap.dedent("""
    def busy(conn, rounds=200_000):
        total = 0
        for i in range(rounds):
            total += i
        return {"total": total}
""")


def _limits(**changes) -> object:
    return dataclasses.replace(isolated(PATIENT_LIMITS, "strict"), **changes)


def spares(worker, *, settled: bool = True) -> list[int]:
    """The pids of the spares the worker keeps (none claimed yet). `settled`: once the worker has forked
    them all and each said it is ready (a `ping` with `settle`: it refills before it answers); else as
    they are now (the worker refills after a reply only while no request waits)."""
    request = {"op": "ping", "settle": True} if settled else {"op": "ping"}
    reply, _ = worker.request(request, timeout=MOMENTS_S)
    return reply["spares"]


def living(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def forked(worker) -> list[int]:
    """Every process the worker's template has forked and that has not ended."""
    (template,) = _children(worker.pid)  # the worker forks nothing itself
    return [pid for pid in _children(template) if living(pid)]


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


def _gone(pids: list[int]) -> bool:
    """Whether every one of `pids` has ended, waiting (up to a hang guard) on each one's pidfd, which
    becomes readable when the process exits."""
    for pid in pids:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            continue  # ended and reaped
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            if not poller.poll(int(MOMENTS_S * 1000)):
                return False
        finally:
            os.close(fd)
    return True


def test_a_world_keeps_its_spares_within_its_process_cap(golden):
    with Runtime(limits=_limits(spare_processes=2, episode_processes=3), workers=1) as rt:
        with rt.open_episode(golden) as loading:  # loads the world: its worker forks spares
            worker = loading._worker
        assert len(spares(worker)) == 2 and len(forked(worker)) == 2
        first = rt.open_episode(golden)
        assert code_process(first) in forked(worker)  # it took a spare: its process was there at the open
        assert len(spares(worker)) == 2 and len(forked(worker)) == 3  # the first episode's process and two spares
        second = rt.open_episode(golden)
        assert len(spares(worker)) == 1 and len(forked(worker)) == 3  # no spare past the cap
        third = rt.open_episode(golden)
        assert spares(worker) == [] and len(forked(worker)) == 3
        fourth = rt.open_episode(golden)  # no spare left: its process is forked at its first call
        for episode in (first, second, third, fourth):
            assert episode.call_tool("get_customer", {"customer_id": 1}).ok
            assert len(forked(worker)) <= 3
        for episode in (first, second, third, fourth):
            episode.close()
        assert len(spares(worker)) == 2 and len(forked(worker)) == 2


def test_a_spare_serves_one_episode_and_is_never_reused(golden):
    with Runtime(limits=_limits(spare_processes=1), workers=1) as rt:
        with rt.open_episode(golden) as loading:  # loads the world: its worker forks a spare
            worker = loading._worker
        (spare,) = spares(worker)
        episode = rt.open_episode(golden)
        assert spare not in spares(worker, settled=False)  # claimed: no other episode can take it
        assert code_process(episode) == spare and database_file(episode)  # ready at the open: its database open
        assert episode.call_tool("update_customer_email", {"customer_id": 1, "email": "mine@example.com"}).ok
        assert code_process(episode) == spare  # the episode's calls run in the spare that waited
        episode.close()
        assert _gone([spare])  # it went with its episode

        for _ in range(3):  # each next episode: another process, on the world as it was
            with rt.open_episode(golden) as after:
                value = after.call_tool("get_customer", {"customer_id": 1}).value
                assert value["email"] != "mine@example.com"
                assert code_process(after) != spare


def test_spares_go_with_their_worlds_worker(golden):
    with Runtime(limits=_limits(spare_processes=2), workers=1) as rt:
        with rt.open_episode(golden) as episode:
            worker = episode._worker
        waiting = spares(worker)
        assert len(waiting) == 2 and all(living(pid) for pid in waiting)
        areas = [entry for entry in os.listdir(worker.scratch) if len(entry) == 32]
        assert len(areas) == 2  # each spare's own directory, made by the spare; no episode's is left
    assert _gone(waiting)
    assert not worker.scratch.exists()


def test_spares_count_against_their_own_world_only(golden):
    other = with_tools(golden, BUSY, ["busy"])
    with Runtime(limits=_limits(spare_processes=2, episode_processes=2), workers=2) as rt:
        kept = rt.open_episode(golden)  # kept open: its worker stays the first world's
        first_world = kept._worker
        assert kept.call_tool("get_customer", {"customer_id": 1}).ok  # its process: a spare's or forked for it
        held = spares(first_world)
        assert len(held) == 1  # its cap: its episode's process and one spare
        sessions = [rt.open_episode(other) for _ in range(2)]
        assert all(session._worker is not first_world for session in sessions)

        with ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda e: e.call_tool("busy", {"rounds": 100_000}), sessions))

        assert all(r.ok for r in results), results  # the other world's cap is its own
        assert spares(first_world) == held and all(living(pid) for pid in held)
        for session in (*sessions, kept):
            session.close()
