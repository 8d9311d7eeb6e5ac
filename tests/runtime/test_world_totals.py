"""Hostile worlds against what a world holds in total (issue 32, point 6): memory, processes, disk.

A process's rlimits bound each episode process and each file, not their sum; the parent keeps the
sums of each world's worker (runtime/totals.py) and the worker never forks past its process cap
(runtime/sandbox/processes.py). Each attack asserts: the call that went over is an env_error naming
the limit, what it did is undone (its process stopped, its files and writes gone), and the world's
other episodes go on untouched, on the same worker, in the same processes.
"""

from __future__ import annotations

import dataclasses
import os
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from support.bundles import with_tools
from support.limits import PATIENT_LIMITS, code_process, database_file, file_area, isolated
from test_isolation import bypassing_workers  # noqa: F401 - the fixture, used below

from worldsmith.runtime.episode import Runtime

pytestmark = pytest.mark.sandbox

MB = 1024 * 1024

HOSTILE = textwrap.dedent("""
    import pathlib

    _HELD = []


    def hoard(conn, mb=150):
        _HELD.append("x" * (mb * 1024 * 1024))
        return len(_HELD)


    def busy(conn, rounds=300_000):
        total = 0
        for i in range(rounds):
            total += i * i
        return total


    def scatter(conn, where="", count=2010, size=80_000):
        for index in range(count):
            with open(pathlib.Path(where) / f"f{index}.bin", "wb") as handle:
                handle.write(b"x" * size)
        return count


    def pile(conn, kb=256):
        conn.execute("CREATE TABLE IF NOT EXISTS pile (blob BLOB)")
        conn.execute("INSERT INTO pile VALUES (zeroblob(?))", (kb * 1024,))
        return conn.execute("SELECT count(*) FROM pile").fetchone()[0]
""")

#: `scatter` past the guard: what an escaped tool writes (the guard counts opens, the parent what is left).
ESCAPED_SCATTER = textwrap.dedent("""
    def scatter_escaped(conn, where="", count=2010, size=80_000):
        def attack(kit):
            os = kit["import"]("os")
            for index in range(count):
                fd = os.open(os.path.join(where, f"e{index}.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
                os.write(fd, b"x" * size)
                os.close(fd)
            return count

        return unguarded(attack)
""")


def _limits(**changes) -> object:
    return dataclasses.replace(isolated(PATIENT_LIMITS, "strict"), **changes)


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as handle:
        return [int(child) for child in handle.read().split()]


# -- memory --------------------------------------------------------------------------------------


def test_episode_processes_of_a_world_hold_no_more_memory_together_than_its_worker_may(golden):
    """Before: three episode processes held 150 MB each against a 256 MB worker limit (each within its own)."""
    env = with_tools(golden, HOSTILE, ["hoard"])
    with Runtime(limits=_limits(memory_mb=256), workers=1) as rt:
        first, second, third = (rt.open_episode(env) for _ in range(3))
        with first, second, third:
            assert first.call_tool("update_customer_email", {"customer_id": 1, "email": "first@example.com"}).ok
            assert second.call_tool("get_customer", {"customer_id": 1}).ok
            worker = first._worker
            kept, hoarder = code_process(first), code_process(second)
            assert first.call_tool("hoard", {"mb": 100}).ok  # within the world's total: it keeps it

            over = second.call_tool("hoard", {"mb": 150})

            assert over.status == "env_error" and over.limit == "world_memory", over
            assert "256 MB" in over.error and "WORLDSMITH_SANDBOX_MEMORY_MB" in over.error
            assert worker.totals.memory <= 256 * MB  # the process that went over was stopped
            assert code_process(second) != hoarder  # reopened on a fresh process (a spare) or none yet
            # the others go on, in their own processes, with their state
            assert code_process(first) == kept and first._worker is worker
            assert first.call_tool("get_customer", {"customer_id": 1}).value["email"] == "first@example.com"
            assert third.call_tool("hoard", {"mb": 50}).ok
            assert second.call_tool("get_customer", {"customer_id": 1}).ok


# -- processes -----------------------------------------------------------------------------------


def test_no_more_episode_processes_than_the_cap_are_ever_alive(golden):
    """Before: with the cap at 2, six sessions calling at once kept six episode processes alive."""
    env = with_tools(golden, HOSTILE, ["busy"])
    with Runtime(limits=_limits(episode_processes=2), workers=1) as rt:
        episodes = [rt.open_episode(env) for _ in range(6)]
        worker = episodes[0]._worker
        seen: list[int] = []
        done = threading.Event()

        (template,) = children(worker.pid)  # the worker forks nothing itself: its template forks them all

        def watch() -> None:  # every process the worker's template has forked, as often as it can look
            while not done.is_set():
                alive = 0
                for pid in children(template):
                    try:
                        with open(f"/proc/{pid}/stat") as handle:
                            alive += handle.read().rsplit(")", 1)[1].split()[0] != "Z"
                    except OSError:
                        pass
                seen.append(alive)

        def session(episode) -> list[str]:
            return [
                (lambda r: r.status if r.ok else r.error)(episode.call_tool("busy", {"rounds": 200_000}))
                for _ in range(4)
            ]

        watcher = threading.Thread(target=watch)
        watcher.start()
        try:
            with ThreadPoolExecutor(len(episodes)) as pool:
                statuses = list(pool.map(session, episodes))
        finally:
            done.set()
            watcher.join()
        assert all(s == ["ok"] * 4 for s in statuses), statuses  # waited for room, none refused
        assert seen and max(seen) <= 2, max(seen)
        assert len(worker._direct) <= 2
        for episode in episodes:
            episode.close()


# -- disk ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("escaped", [False, True], ids=["guarded", "escaped"])
def test_one_call_cannot_leave_thousands_of_files(golden, escaped, request):
    """Before: one call wrote 160 MB in 2,010 files of its episode's file area."""
    if escaped:
        request.getfixturevalue("bypassing_workers")
    env = with_tools(golden, HOSTILE + ESCAPED_SCATTER, ["scatter", "scatter_escaped"])
    tool = "scatter_escaped" if escaped else "scatter"
    with Runtime(limits=_limits(call_files=64, file_size_mb=16), workers=1) as rt:
        bystander, culprit = rt.open_episode(env), rt.open_episode(env)
        with bystander, culprit:
            assert bystander.call_tool("update_customer_email", {"customer_id": 1, "email": "b@example.com"}).ok
            assert culprit.call_tool("update_customer_email", {"customer_id": 2, "email": "c@example.com"}).ok
            assert bystander.call_tool("scatter", {"where": file_area(bystander), "count": 3, "size": 10}).ok
            kept = code_process(bystander)

            area = file_area(culprit)
            result = culprit.call_tool(tool, {"where": area, "count": 2010, "size": 1000})

            assert result.status == "env_error" and result.limit == "call_files", result
            assert "64" in result.error and "WORLDSMITH_SANDBOX_CALL_FILES" in result.error
            left = os.listdir(area) if os.path.isdir(area) else []
            assert len(left) <= 64 and culprit._worker.totals.files <= 64 + 2 * 4
            # its earlier writes stand (replayed), and it goes on
            assert culprit.call_tool("get_customer", {"customer_id": 2}).value["email"] == "c@example.com"
            assert code_process(bystander) == kept and sorted(os.listdir(file_area(bystander))) == [
                "f0.bin",
                "f1.bin",
                "f2.bin",
            ]
            assert bystander.call_tool("get_customer", {"customer_id": 1}).value["email"] == "b@example.com"


def test_one_call_cannot_write_more_bytes_than_a_file_may_hold(golden):
    env = with_tools(golden, HOSTILE, ["scatter"])
    with Runtime(limits=_limits(file_size_mb=1), workers=1) as rt:
        with rt.open_episode(env) as episode:
            assert episode.call_tool("get_customer", {"customer_id": 1}).ok
            area = file_area(episode)
            result = episode.call_tool("scatter", {"where": area, "count": 4, "size": 600_000})
            assert result.status == "env_error" and result.limit == "call_size", result
            assert "1 MB" in result.error and "WORLDSMITH_SANDBOX_FILE_SIZE_MB" in result.error
            assert not os.path.exists(area)  # what it wrote went with its episode's process and files
            assert episode.call_tool("get_customer", {"customer_id": 1}).ok
            assert episode.call_tool("scatter", {"where": file_area(episode), "count": 1, "size": 600_000}).ok


@pytest.mark.parametrize("isolation", ["strict", "fast"])
def test_an_episode_database_grows_no_more_than_its_allowance(golden, isolation):
    """Before: honest inserts grew every session's database to the file size limit (16 MB each)."""
    env = with_tools(golden, HOSTILE, ["pile"])
    limits = dataclasses.replace(isolated(PATIENT_LIMITS, isolation), file_size_mb=16, episode_db_growth_mb=1)
    with Runtime(limits=limits, workers=1) as rt:
        bystander, culprit = rt.open_episode(env), rt.open_episode(env)
        with bystander, culprit:
            assert bystander.call_tool("pile", {"kb": 64}).ok
            results = [culprit.call_tool("pile", {"kb": 256}) for _ in range(8)]
            refused = [r for r in results if not r.ok]
            assert refused and all(r.status == "env_error" and r.limit == "database_size" for r in refused), refused
            assert "WORLDSMITH_SANDBOX_EPISODE_DB_GROWTH_MB" in refused[0].error
            kept = sum(r.ok for r in results)
            assert 1 <= kept < 8  # the rows that fit stay; a refused call's writes are gone
            assert culprit.call_tool("pile", {"kb": 1}).value == kept + 1
            if isolation == "strict":
                assert os.path.getsize(database_file(culprit)) <= len(golden.world) + MB
            assert bystander.call_tool("pile", {"kb": 64}).value == 2


def test_a_world_holds_no_more_on_disk_than_its_total(golden):
    """Before: each of 4,096 sessions' databases could grow to 16 MB (64 GB for one world)."""
    env = with_tools(golden, HOSTILE, ["pile"])
    total_mb = 3  # the golden world is ~0.1 MB; each episode may grow by 1 MB
    with Runtime(limits=_limits(world_disk_mb=total_mb, episode_db_growth_mb=1), workers=1) as rt:
        episodes = [rt.open_episode(env) for _ in range(6)]
        try:
            outcomes = [episode.call_tool("pile", {"kb": 700}) for episode in episodes]
            refused = [r for r in outcomes if not r.ok]
            assert refused and all(r.limit == "world_disk" for r in refused), outcomes
            assert "WORLDSMITH_SANDBOX_WORLD_DISK_MB" in refused[0].error
            worker = episodes[0]._worker
            assert worker.totals.disk <= total_mb * MB
            on_disk = sum(f.stat().st_size for f in (worker.scratch / "databases").iterdir())
            assert on_disk <= total_mb * MB
            for episode, outcome in zip(episodes, outcomes, strict=True):  # the piles that fit stay
                if outcome.ok:
                    assert episode.call_tool("pile", {"kb": 0}).value == 2
        finally:
            for episode in episodes:
                episode.close()


def test_a_world_holds_no_more_files_than_its_total(golden):
    env = with_tools(golden, HOSTILE, ["scatter"])
    with Runtime(limits=_limits(world_files=40, call_files=64), workers=1) as rt:
        episodes = [rt.open_episode(env) for _ in range(4)]
        try:
            assert all(e.call_tool("get_customer", {"customer_id": 1}).ok for e in episodes)
            outcomes = [e.call_tool("scatter", {"where": file_area(e), "count": 12, "size": 10}) for e in episodes]
            assert [o.ok for o in outcomes[:2]] == [True, True]
            refused = [o for o in outcomes if not o.ok]
            assert refused and all(o.limit == "world_files" for o in refused), outcomes
            assert episodes[0]._worker.totals.files <= 40
        finally:
            for episode in episodes:
                episode.close()
