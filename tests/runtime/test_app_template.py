"""An imported (ASGI) world under strict isolation builds its app once, in the template (issue 32).

The template builds the app before it forks any process, on a private copy of the world; every
episode's process is a copy of it, so no episode builds the app again, and none sees what another
did to the app's memory: each mutates its own copy. The app here is the AWM-format sample with
`list_branches` changed to answer (as a refusal, so the tool's schema stays) when its module was
run, and how many calls this process's copy of it has counted.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import re
import statistics

import psutil
import pytest
from support.limits import PATIENT_LIMITS, code_process, isolated
from support.paths import REPO
from support.patience import MOMENTS_S

from worldsmith.runtime.episode import Runtime

pytestmark = pytest.mark.sandbox

STAMPED = (
    "MAX_RENEWALS = 2\n",
    "MAX_RENEWALS = 2\nimport time as _stamp_clock\nBUILT_AT = _stamp_clock.perf_counter_ns()\nCALLS = []\n",
)
COUNTING = (
    "async def list_branches():\n",
    "async def list_branches():\n"
    "    CALLS.append(1)\n"
    '    raise HTTPException(status_code=418, detail=f"built {BUILT_AT} calls {len(CALLS)}")\n',
)


#: What `watched` adds: the app's own code that runs per request (an ASGI middleware) and per row loaded (a
#: `load` listener on Branch), each counting in the module; list_branches answers the counts.
WATCHING = (
    "\nfrom sqlalchemy import event as _watch_event\nREQUESTS = []\nLOADS = []\n\n\n"
    "class _CountRequests:\n    def __init__(self, app):\n        self.app = app\n\n"
    "    async def __call__(self, scope, receive, send):\n        REQUESTS.append(1)\n"
    "        await self.app(scope, receive, send)\n\n\napp.add_middleware(_CountRequests)\n\n\n"
    '@_watch_event.listens_for(Branch, "load")\ndef _count_loads(target, context):\n    LOADS.append(1)\n'
)
WATCHED_ANSWER = (
    'detail=f"built {BUILT_AT} calls {len(CALLS)}"',
    'detail=f"built {BUILT_AT} calls {len(CALLS)} requests {len(REQUESTS)} loads {len(LOADS)}"',
)


@functools.cache
def _imported_sample():
    """The AWM-format sample imported (once per test process)."""
    from worldsmith.interop.awm import import_scenario, read_release

    (scenario,) = read_release(REPO / "tests" / "data" / "awm_format_sample")
    with Runtime(limits=PATIENT_LIMITS, workers=1) as runtime:
        bundle = import_scenario(scenario, runtime).bundle
    assert bundle is not None
    return bundle


def _changed_sample(replacements: tuple[tuple[str, str], ...], appended: str = ""):
    """The AWM-format sample imported, its app.py with `replacements` made and `appended` added."""
    bundle = _imported_sample()
    app = bundle.text("app.py")
    for old, new in replacements:
        assert old in app
        app = app.replace(old, new, 1)
    app += appended
    artifacts = {**bundle.manifest.artifacts, "app.py": "sha256:" + hashlib.sha256(app.encode()).hexdigest()}
    return dataclasses.replace(
        bundle,
        files={**bundle.files, "app.py": app.encode()},
        manifest=bundle.manifest.model_copy(update={"artifacts": artifacts}),
    )


@pytest.fixture(scope="module")
def stamped():
    """The AWM-format sample imported, its app changed as the module docstring says."""
    return _changed_sample((STAMPED, COUNTING))


@pytest.fixture(scope="module")
def watched():
    """`stamped`, with a middleware and a load listener of the app's counting (`WATCHING`)."""
    return _changed_sample((STAMPED, COUNTING, WATCHED_ANSWER), WATCHING)


def stamp(episode) -> tuple[int, int]:
    """(when the app's module ran, how many calls this process's copy of the app has counted)."""
    result = episode.call_tool("list_branches", {})
    assert result.status == "tool_error", result
    built, calls = re.search(r"built (\d+) calls (\d+)", result.error).groups()
    return int(built), int(calls)


@pytest.mark.timeout(300)
def test_the_app_is_built_once_and_each_episode_has_its_own_copy(stamped):
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        with rt.open_episode(stamped) as first, rt.open_episode(stamped) as second:
            built, calls = stamp(first)
            assert calls == 1
            assert stamp(first) == (built, 2)  # the episode's process keeps its app between calls
            assert stamp(second) == (built, 1)  # the same build, but not the first episode's copy of it
            assert code_process(first) != code_process(second)
            first.reset()  # its next call is served by a process forked afresh
            assert stamp(first) == (built, 1)
            # built before any of them, in the template: the worker's one child, their parent
            (template,) = psutil.Process(first._worker.pid).children()
            assert {code_process(first), code_process(second)} <= {p.pid for p in template.children()}
        with rt.open_episode(stamped) as third:
            assert stamp(third) == (built, 1)


@pytest.mark.timeout(300)
def test_an_episode_starts_from_the_apps_module_state_as_a_fresh_start_has_it(watched):
    """The template and the spares build what the app's first request would (`asgi.warm`), but run
    none of its per-request or per-row code: an episode's first call is the first request its
    middleware counts, and no row of Branch was loaded before it (the call raises before querying)."""
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        for _ in range(3):  # the first from a spare claimed at once, the later ones from warmed spares
            with rt.open_episode(watched) as episode:
                result = episode.call_tool("list_branches", {})
                assert result.status == "tool_error", result
                assert re.search(r"calls 1 requests 1 loads 0$", result.error), result.error
                result = episode.call_tool("list_branches", {})
                assert re.search(r"calls 2 requests 2 loads 0$", result.error), result.error


def test_the_templates_thread_filter_refuses_threads_but_not_forks():
    """`kernel.forbid_threads`, installed in the template before it runs app code: nothing that code
    starts can run beside the template's loop, and the template still forks its processes."""
    import os
    import threading

    from worldsmith.runtime.sandbox import kernel

    pid = os.fork()
    if pid == 0:  # the filter stays with this child
        code = 1
        try:
            kernel.no_new_privs()  # what an unprivileged process needs to install a filter
            kernel.forbid_threads()
            try:
                threading.Thread(target=lambda: None).start()
            except RuntimeError:
                grandchild = os.fork()
                if grandchild == 0:
                    os._exit(7)
                code = 0 if os.waitstatus_to_exitcode(os.waitpid(grandchild, 0)[1]) == 7 else 2
        finally:
            os._exit(code)
    assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0


def _minor_faults(pid: int) -> int:
    """Minor page faults of process `pid` so far (/proc/PID/stat: copy-on-write of what it wrote)."""
    with open(f"/proc/{pid}/stat") as handle:
        return int(handle.read().rsplit(")", 1)[1].split()[7])


def _first_call_faults(bundle, *, first_pages: bool, rounds: int = 3) -> list[int]:
    """Minor page faults of each episode's first call (`list_branches`), each episode opened with its
    worker's spares at rest (forked, ready, warm), under strict isolation."""
    faults = []
    limits = dataclasses.replace(isolated(PATIENT_LIMITS, "strict"), first_pages=first_pages)
    with Runtime(limits=limits, workers=1) as rt:
        with rt.open_episode(bundle) as episode:  # the worker starts, loads the world, forks its spares
            worker = episode._worker
        for _ in range(rounds):
            assert worker.spares_at_rest(MOMENTS_S)
            with rt.open_episode(bundle) as episode:
                pid = episode._worker.channel_pid(episode.id) or code_process(episode)
                before = _minor_faults(pid)
                assert episode.call_tool("list_branches", {}).ok
                faults.append(_minor_faults(pid) - before)
    return faults


@pytest.mark.timeout(300)
def test_spares_write_ahead_the_pages_an_imported_worlds_first_call_writes():
    """The probe's pages (runtime/sandbox/firstpages.py): a spare at rest has already made its own the
    pages of the template that an episode's first call writes, so that call copies a fraction of the
    pages it copies with `first_pages` off (no probe; the spares only warm up: observed 80 against 700)."""
    sample = _changed_sample(())
    ahead = _first_call_faults(sample, first_pages=True)
    without = _first_call_faults(sample, first_pages=False)
    assert statistics.median(ahead) * 3 < statistics.median(without), (ahead, without)


@pytest.mark.timeout(300)
def test_a_probe_that_never_ends_costs_the_world_its_pages_only():
    """An app whose stand-in calls never return: its probe is stopped at its deadline, the world loads,
    its spares are forked without pages, its episodes are served, and no probe is left behind."""
    looping = _changed_sample(
        (("async def list_branches():\n", "async def list_branches():\n    while True:\n        pass\n"),)
    )
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        with rt.open_episode(looping) as episode:
            assert episode.call_tool("get_book", {"book_id": 1}).ok
            worker = episode._worker
            assert worker.spares_at_rest(MOMENTS_S)
            reply, _ = worker.request({"op": "ping"}, timeout=MOMENTS_S)
            spares = reply["spares"]
            (template,) = psutil.Process(worker.pid).children()
            living = {p.pid for p in template.children() if p.status() != psutil.STATUS_ZOMBIE}
            assert living == {*spares, code_process(episode)}


@pytest.mark.timeout(300)
def test_a_probe_whose_pages_the_parent_never_sends_goes_with_the_next_request():
    """The worker keeps its probe (and forks no spare) only until the parent sends its pages: any other
    request ends it, with its directory and database, and the spares are forked; pages sent after that
    are refused."""
    from worldsmith.bundle.kinds import APP_TOOLS

    sample = _changed_sample(())
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        worker = rt.pool_for_kind(APP_TOOLS).acquire(sample.runtime_key)
        load = {
            "op": "load_env",
            "env": sample.runtime_key,
            "tools_kind": APP_TOOLS.name,
            "app": sample.text("app.py"),
            "verifiers": sample.text("verifiers.py"),
            "tool_names": [t.name for t in sample.tools],
            "probe": True,
        }
        reply, _ = worker.request(load, [sample.world], timeout=MOMENTS_S)
        probe = reply["probe_pid"]
        assert psutil.pid_exists(probe)
        reply, _ = worker.request({"op": "ping", "settle": True}, timeout=MOMENTS_S)  # not its pages: it goes
        assert not psutil.pid_exists(probe) or psutil.Process(probe).status() == psutil.STATUS_ZOMBIE
        spares = reply["spares"]
        assert len(spares) == PATIENT_LIMITS.spare_processes
        areas = [entry for entry in worker.scratch.iterdir() if entry.name != "databases"]
        databases = list((worker.scratch / "databases").glob("*.db"))
        assert len(areas) == len(spares) == len(databases)  # the probe's gone with it
        late = {"op": "first_pages", "env": sample.runtime_key}
        reply, _ = worker.request(late, [b""], timeout=MOMENTS_S)
        assert reply["status"] == "env_error" and "no probe" in reply["error"]


# -- stand-in reads (runtime/sandbox/standin.py) ----------------------------------------------------

#: list_branches made to answer (as a refusal) how many statements its engine had compiled before its
#: query and after it: equal when the template's stand-in reads compiled it already.
COMPILING = (
    "async def list_branches():\n    with SessionLocal() as session:\n"
    "        rows = session.scalars(select(Branch).order_by(Branch.id)).all()\n"
    "        return [BranchOut.model_validate(row) for row in rows]\n",
    "async def list_branches():\n    compiled = len(engine._compiled_cache)\n    with SessionLocal() as session:\n"
    "        session.scalars(select(Branch).order_by(Branch.id)).all()\n"
    "    raise HTTPException(status_code=418, detail=f'compiled {compiled} {len(engine._compiled_cache)}')\n",
)

#: Apps that keep something of each request (appended to the sample: an ASGI middleware of theirs that
#: counts in `app.state`, or fills an lru_cache): their template makes no stand-in read.
KEEPING = {
    "app.state": "app.state.requests = getattr(app.state, 'requests', 0) + 1",
    "lru_cache": "_seen(scope['path'])",
    "a global of an http middleware": None,  # `@app.middleware("http")`: Starlette's BaseHTTPMiddleware
}
HTTP_MIDDLEWARE = (
    "\nREQUESTS = []\n\n\n@app.middleware('http')\nasync def _keep(request, call_next):\n"
    "    REQUESTS.append(request.url.path)\n    return await call_next(request)\n"
)
KEEPER = (
    "\nimport functools as _functools\n\n\n@_functools.lru_cache\ndef _seen(path):\n    return path\n\n\n"
    "class _Keep:\n    def __init__(self, app):\n        self.app = app\n\n"
    "    async def __call__(self, scope, receive, send):\n        KEEP\n"
    "        await self.app(scope, receive, send)\n\n\napp.add_middleware(_Keep)\n"
)


def _first_compiles(bundle, *, stand_in_reads: bool = True, episodes: int = 2) -> list[tuple[int, int]]:
    """Per episode, what its first call of list_branches (`COMPILING`) says: statements compiled before
    its query and after it."""
    limits = dataclasses.replace(isolated(PATIENT_LIMITS, "strict"), stand_in_reads=stand_in_reads)
    answers = []
    with Runtime(limits=limits, workers=1) as rt:
        for _ in range(episodes):
            with rt.open_episode(bundle) as episode:
                result = episode.call_tool("list_branches", {})
                assert result.status == "tool_error", result
                before, after = re.search(r"compiled (\d+) (\d+)", result.error).groups()
                answers.append((int(before), int(after)))
    return answers


@pytest.mark.timeout(300)
def test_an_episodes_first_call_finds_its_statement_compiled_by_the_templates_stand_in_reads():
    """The template made one request to each GET route before it forked (the app keeps nothing of
    them): an episode's first call compiles nothing new. With `stand_in_reads` off it compiles its query."""
    sample = _changed_sample((COMPILING,))
    assert all(before == after for before, after in _first_compiles(sample))
    assert all(after == before + 1 for before, after in _first_compiles(sample, stand_in_reads=False))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("keeps", sorted(KEEPING))
def test_an_app_that_keeps_something_of_its_requests_gets_no_stand_in_reads(keeps):
    """The trial fork saw the app's own state change: the template made no request, and each episode's
    first call starts from the app as built (its query compiled there, the app's store empty)."""
    keeper = KEEPING[keeps]
    sample = _changed_sample((COMPILING,), HTTP_MIDDLEWARE if keeper is None else KEEPER.replace("KEEP", keeper))
    assert all(after == before + 1 for before, after in _first_compiles(sample))


@pytest.mark.timeout(300)
def test_the_routes_read_ahead_are_reported_with_the_apps_tools():
    """`Runtime.describe_app` (what an import reports as `read ahead`): the GET routes the template read,
    none for an app that keeps something of a request."""
    sample = _changed_sample(())
    keeping = _changed_sample((), KEEPER.replace("KEEP", KEEPING["app.state"]))
    with Runtime(limits=isolated(PATIENT_LIMITS, "strict"), workers=1) as rt:
        described = rt.describe_app(sample.text("app.py"), sample.world)
        assert described.stand_in_reads == _get_routes() and len(described.stand_in_reads) == 9
        assert rt.describe_app(keeping.text("app.py"), keeping.world).stand_in_reads == []


def _get_routes() -> list[str]:
    """The sample's GET operations by tool name, from its release's spec."""
    spec = json.loads((REPO / "tests" / "data" / "awm_format_sample" / "gen_spec.jsonl").read_text().splitlines()[0])
    endpoints = (e for group in spec["api_spec"]["api_groups"] for e in group["endpoints"])
    return sorted(e["operation_id"] for e in endpoints if e["method"].upper() == "GET")


#: The same middlewares keeping nothing: their template makes the stand-in reads.
KEEPING_NOTHING = {
    "an ASGI middleware": KEEPER.replace("KEEP", "pass"),
    "an http middleware": HTTP_MIDDLEWARE.replace("REQUESTS.append(request.url.path)", "request.url.path"),
}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("middleware", sorted(KEEPING_NOTHING))
def test_an_app_whose_middleware_keeps_nothing_gets_its_stand_in_reads(middleware):
    """The control of the test above: the same apps without what they keep pass the trial."""
    sample = _changed_sample((COMPILING,), KEEPING_NOTHING[middleware])
    assert all(before == after for before, after in _first_compiles(sample))


@pytest.mark.timeout(300)
def test_stand_in_reads_that_take_too_long_are_not_made_and_the_world_is_served():
    """A GET route that sleeps past the trial's time (list_book_reviews, book 1): the trial is stopped,
    the template makes no request, the world loads and serves its episodes (their first calls compile
    their queries)."""
    sleeping = (
        "        reviews = session.scalars(\n",
        "        _sleep_clock.sleep(5)\n        reviews = session.scalars(\n",
    )
    sample = _changed_sample((COMPILING, sleeping), "\nimport time as _sleep_clock\n")
    assert all(after == before + 1 for before, after in _first_compiles(sample, episodes=1))
