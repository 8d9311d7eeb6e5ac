"""The runtime at scale (issue 24): a parent holding thousands of descriptors, sessions spread over
the workers, and the per-call module-state check that keeps calls cheap."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import resource
import signal
import threading

import psutil
import pytest
from support.bundles import with_tools
from support.limits import PATIENT_LIMITS, code_process, isolated
from support.patience import MOMENTS_S, PROCESS_S, wait_until

from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.sandbox import modulestate
from worldsmith.runtime.sandbox.modulestate import ModuleState

pytestmark = pytest.mark.sandbox

HELD_DESCRIPTORS = 10_000
CALL = ("get_customer", {"customer_id": 1})
#: A call of about a second of CPU (more on a loaded machine).
SLOW_TOOL = "def slow_sum(conn):\n    return sum(range(40_000_000))\n"


@contextlib.contextmanager
def holding_descriptors(count: int):
    """This process with `count` more descriptors open (its soft RLIMIT_NOFILE raised as needed), as a
    gateway with thousands of open connections is: every pipe it opens next is numbered past them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count + 1024
    if hard != resource.RLIM_INFINITY and hard < wanted:
        pytest.skip(f"the hard descriptor limit ({hard}) is below the {wanted} this test holds")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    held: list[int] = []
    try:
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(count)]
        yield max(held)
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_parent_holding_ten_thousand_descriptors_runs_its_workers_normally(golden):
    with holding_descriptors(HELD_DESCRIPTORS) as highest, Runtime(limits=PATIENT_LIMITS, workers=2) as runtime:
        task = golden.tasks[0].id
        first, second = runtime.open_episode(golden, task), runtime.open_episode(golden, task)
        assert first._worker is not second._worker  # both workers started, each past the held descriptors
        for episode in (first, second):
            assert episode._worker.process.stdout.fileno() > highest
            assert episode.call_tool(*CALL).ok
            assert episode.call_tool("update_customer_email", {"customer_id": 2, "email": "n@example.com"}).ok
            assert episode.verify("").status in {"complete", "partial", "incomplete"}
        # a worker killed from outside is replaced; the replacement (new pipes, as high) serves the episode
        lost = first._worker
        os.kill(lost.process.pid, signal.SIGKILL)
        lost.process.wait()
        assert first.call_tool(*CALL).ok
        assert first._worker is not lost and first._worker.process.stdout.fileno() > highest
        assert first.call_tool("get_customer", {"customer_id": 2}).value["email"] == "n@example.com"
        first.close()
        second.close()


def test_sequential_sessions_take_turns_over_the_workers(golden):
    with Runtime(limits=PATIENT_LIMITS, workers=2) as runtime:
        placed = []
        for _ in range(4):  # one session after another, each closed before the next opens
            with runtime.open_episode(golden) as episode:
                assert episode.call_tool(*CALL).ok
                placed.append(episode._worker.name)
        assert len(set(placed)) == 2 and placed[:2] == placed[2:], placed
        # concurrent sessions: evenly over the workers
        episodes = [runtime.open_episode(golden) for _ in range(4)]
        assert sorted(w.episodes for w in runtime.pool.workers()) == [2, 2]
        for episode in episodes:
            episode.close()


def test_spreading_keeps_each_worlds_workers_loaded(golden):
    """A world's sessions spread over free slots, never by retiring another world's idle worker: that
    world's next session finds its code and database loaded."""
    other = with_tools(golden, "def marker(conn):\n    return 1\n", ["marker"])
    with Runtime(limits=PATIENT_LIMITS, workers=2) as runtime:
        with runtime.open_episode(golden) as episode:
            assert episode.call_tool(*CALL).ok
        with runtime.open_episode(other) as episode:  # the free slot
            assert episode.call_tool("marker").ok
            others_worker = episode._worker
        for _ in range(3):
            with runtime.open_episode(golden) as episode:
                assert episode.call_tool(*CALL).ok
                assert episode._worker is not others_worker
        with runtime.open_episode(other) as episode:
            assert episode._worker is others_worker and other.runtime_key in others_worker.loaded_envs


@pytest.mark.unit
def test_the_module_state_check_sees_every_kind_of_change():
    """The per-call check skips tables whose version tag is unchanged: every way of changing a table
    still gets it compared, reported and restored."""
    assert modulestate._VERSION_TAGS, "this interpreter's dict version tags are not read: every call walks every table"
    marker, table = object(), {"kept": 1, "other": 2}
    state = ModuleState(frozenset(), {"fake": table})
    clean = dict(table)
    changes = {
        "set": lambda: table.__setitem__("kept", marker),
        "add": lambda: table.__setitem__("added", marker),
        "delete": lambda: table.__delitem__("kept"),
        "update": lambda: table.update(other=marker),
        "setdefault": lambda: table.setdefault("added", marker),
        "pop": lambda: table.pop("other"),
        "popitem": table.popitem,
        "clear": table.clear,
    }
    for how, change in changes.items():
        change()
        assert state.changed(), how
        assert table == clean, how
        assert state.changed() == [], how  # restored: clean again, and seen as clean
    table["kept"] = marker  # changed and changed back: nothing to report
    table["kept"] = clean["kept"]
    assert state.changed() == []


def test_a_long_call_does_not_hold_up_other_episodes_of_its_worker(golden):
    """Strict isolation: once an episode has made a call, its calls go to its own process directly
    (runtime/channel.py), not through the worker, so episodes sharing a worker call side by side."""
    world = with_tools(golden, SLOW_TOOL, ["slow_sum"])
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as runtime:
        slow, quick = runtime.open_episode(world), runtime.open_episode(world)
        assert slow._worker is quick._worker
        for episode in (slow, quick):
            assert episode.call_tool(*CALL).ok
        long_call: list = []
        process = psutil.Process(code_process(slow))
        idle_cpu_s = sum(process.cpu_times()[:2])
        thread = threading.Thread(target=lambda: long_call.append(slow.call_tool("slow_sum")))
        thread.start()
        wait_until(lambda: sum(process.cpu_times()[:2]) > idle_cpu_s, "the long call to run in its process")
        answered = [quick.call_tool("get_customer", {"customer_id": n}) for n in (1, 2, 3)]
        still_running = thread.is_alive()
        thread.join()
        assert all(result.ok for result in answered)
        assert still_running, "the quick episode's calls waited for the long call of its worker"
        assert long_call[0].ok and long_call[0].value == sum(range(40_000_000))
        slow.close()
        quick.close()


def test_direct_channels_past_the_cap_of_a_worker_are_given_up_with_their_processes(golden):
    """Past `episode_processes` channels on a worker the least recently used idle one is given up: its
    process exits and is reaped; the episode's next call forks a fresh one on the same database."""
    limits = dataclasses.replace(isolated(PATIENT_LIMITS, "strict"), episode_processes=2)
    with Runtime(limits=limits, workers=1) as runtime:
        episodes = [runtime.open_episode(golden) for _ in range(6)]
        for round_ in range(2):
            for n, episode in enumerate(episodes):
                email = f"r{round_}e{n}@example.com"
                assert episode.call_tool("update_customer_email", {"customer_id": 2, "email": email}).ok
        worker = episodes[0]._worker

        def at_most_two_processes() -> bool:
            return len(worker.request({"op": "ping"}, timeout=MOMENTS_S)[0]["processes"]) <= 2

        wait_until(at_most_two_processes, "the given-up processes to exit")  # none left over
        for n, episode in enumerate(episodes):  # each episode kept its own state through it all
            assert episode.call_tool("get_customer", {"customer_id": 2}).value["email"] == f"r1e{n}@example.com"
            episode.close()


SHORT_OF_DESCRIPTORS = """
import json, os, sys
from worldsmith.bundle.loader import load_bundle
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.limits import SandboxLimits
golden = load_bundle(sys.argv[1])
limits = SandboxLimits(call_timeout_s=float(sys.argv[2]), cpu_s=float(sys.argv[3]))
with Runtime(limits=limits, workers=1) as runtime:
    first, second = runtime.open_episode(golden), runtime.open_episode(golden)
    assert first.call_tool("get_customer", {"customer_id": 1}).ok
    held = []
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))
    except OSError:
        os.close(held.pop())  # one descriptor free: a hand-over brings two
    short = second.call_tool("get_customer", {"customer_id": 1})
    for fd in held:
        os.close(fd)
    after = [e.call_tool("get_customer", {"customer_id": 1}).ok for e in (first, second)]
    print(json.dumps({"short": short.status, "after": after, "moved": first.relocations + second.relocations}))
"""


def test_a_parent_short_of_descriptors_answers_through_the_worker(golden):
    """A hand-over the parent has no descriptors for is not the worker's fault: the call is answered,
    the worker and its episodes go on."""
    import json
    import subprocess
    import sys

    from support.paths import GOLDEN

    patience = [str(PATIENT_LIMITS.call_timeout_s), str(PATIENT_LIMITS.cpu_s)]
    done = subprocess.run(
        [sys.executable, "-c", SHORT_OF_DESCRIPTORS, str(GOLDEN), *patience],
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == {"short": "ok", "after": [True, True], "moved": 0}
