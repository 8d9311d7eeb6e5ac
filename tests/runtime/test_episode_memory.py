"""Nothing of another session in an episode process's memory (issue 32, point 2).

An episode process forked from a worker that had served other sessions inherited the worker's heap,
where their requests (first calls' arguments, final answers, database bytes) had been decoded: an
escape past the Python guard read them there. The attack here is that reader, as strong as it can
be: the test (the same uid as the sandbox, or root) reads the culprit's episode process's whole
memory through /proc/PID/mem and searches it for markers that only other sessions passed. Under
strict isolation episode processes fork from the worker's template, which never holds a request.
"""

from __future__ import annotations

import time
import uuid

import psutil
import pytest
from support.limits import PATIENT_LIMITS, code_process, isolated
from support.paths import REPO

from worldsmith.runtime.episode import Runtime

pytestmark = pytest.mark.sandbox


def memory_of(pid: int) -> bytes:
    """Every readable private or anonymous mapping of process `pid` (files mapped read-only, the
    interpreter's and libraries' code, are left out: they hold no session's data)."""
    chunks = []
    with open(f"/proc/{pid}/maps") as maps, open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
        for line in maps:
            fields = line.split()
            (start, end), perms = (int(x, 16) for x in fields[0].split("-")), fields[1]
            if not perms.startswith("r") or (len(fields) > 5 and fields[5].startswith("/") and "w" not in perms):
                continue
            try:
                mem.seek(start)
                chunks.append(mem.read(end - start))
            except (OSError, OverflowError, ValueError):
                continue  # [vvar] and the like
    return b"\0".join(chunks)


def found(memory: bytes, markers: dict[str, str]) -> list[str]:
    """The markers present in `memory`, as UTF-8 or as Python's 4-byte (UCS-4) strings."""
    seen = []
    for name, marker in markers.items():
        ucs4 = marker.encode("utf-32-le")
        if marker.encode() in memory or ucs4 in memory:
            seen.append(name)
    return seen


@pytest.fixture(scope="module")
def imported():
    """The AWM-format sample imported: an ASGI world (a FastAPI app, in workers with the web stack)."""
    from worldsmith.interop.awm import import_scenario, read_release

    (scenario,) = read_release(REPO / "tests" / "data" / "awm_format_sample")
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        bundle = import_scenario(scenario, runtime).bundle
    assert bundle is not None
    return bundle


#: Per world: a write whose one string argument carries a marker, and a read.
CALLS = {
    "native": (("update_customer_email", "customer_id", 2, "email"), ("get_customer", {"customer_id": 1})),
    "asgi": (("update_my_profile", None, None, "email"), ("list_branches", {})),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("world", ["native", "asgi"])
def test_an_episode_process_holds_nothing_of_other_sessions(world, golden, request):
    bundle = golden if world == "native" else request.getfixturevalue("imported")
    (write, key, value, field), (read, read_arguments) = CALLS[world]
    markers = {
        "first-call argument": f"arg{uuid.uuid4().hex}",
        "final answer": f"answer{uuid.uuid4().hex}",
        "later-call argument": f"later{uuid.uuid4().hex}",
    }

    def writing(marker: str) -> dict[str, object]:
        return {**({key: value} if key else {}), field: f"{marker}@example.com"}

    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        with rt.open_episode(bundle, bundle.tasks[0]) as victim:
            # its first call goes through the worker (later ones straight to its process); its
            # verification through the worker, to a process of its own
            assert victim.call_tool(write, writing(markers["first-call argument"])).ok
            assert victim.call_tool(write, writing(markers["later-call argument"])).ok
            victim.verify(" ".join([markers["final answer"]] * 200))  # a long answer: freed to malloc, kept
            victim.reset()  # its next call forks a process anew, after all of the above
            assert victim.call_tool(read, read_arguments).ok
            with rt.open_episode(bundle, bundle.tasks[0]) as culprit:
                own = f"own{uuid.uuid4().hex}"
                assert culprit.call_tool(write, writing(own)).ok
                assert culprit.call_tool(read, read_arguments).ok
                pid = code_process(culprit)
                assert pid is not None and pid != code_process(victim)
                memory = memory_of(pid)
                assert found(memory, {"own": own}) == ["own"]  # the reader sees what the process holds
                assert found(memory, markers) == []
                # nor does the template they are forked from (the worker's one child) hold any of it
                (template,) = psutil.Process(culprit._worker.pid).children()
                assert pid in {child.pid for child in template.children()}
                assert found(memory_of(template.pid), {"own": own, **markers}) == []


@pytest.mark.timeout(180)
def _ended(process: psutil.Process) -> bool:
    """Whether `process` has ended: a zombie its parent has not reaped yet, or reaped already."""
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_lost_template_costs_its_worker_not_its_episodes(golden):
    """The template dying (a native world's runs no generated code: only from outside) leaves the
    worker nothing clean to fork from: it exits, and its episodes move to a fresh worker by journal
    replay, as for a crash."""
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        with rt.open_episode(golden) as first:
            assert first.call_tool("update_customer_email", {"customer_id": 2, "email": "kept@example.com"}).ok
            worker = first._worker
            (template,) = psutil.Process(worker.pid).children()
            template.kill()
            while not _ended(template):
                time.sleep(0.01)
            with rt.open_episode(golden) as second:
                assert second.call_tool("get_customer", {"customer_id": 1}).ok
                assert not worker.alive
                while "template process is gone" not in worker.stderr_tail():  # read by a thread of the parent
                    time.sleep(0.01)
                assert first.call_tool("get_customer", {"customer_id": 2}).value["email"] == "kept@example.com"
                assert first._worker is second._worker is not worker


def test_a_strict_worker_loads_its_environment_once_however_often_asked(golden):
    """Threads opening episodes at once may each send the worker `load_env` before the first reply: the
    template holds the environment loaded first, and loading it again is a no-op, not a refusal."""
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt, rt.open_episode(golden) as first:
        worker = first._worker
        worker.loaded_envs.discard(golden.runtime_key)  # as a racing thread sees it
        rt.pool.ensure_env(worker, golden)
        with rt.open_episode(golden) as second:
            assert second._worker is worker and second.call_tool("get_customer", {"customer_id": 1}).ok
