"""An imported app's first request in a forked process, per warm-up: where its cost goes (issue 32).

    .venv/bin/python bench/first_request.py [--forks 7]

Outside the sandbox (no guard, no confinement: the app's own cost), as a template and its spares do
it: the vendored AWM sample's app built once in this process (`asgi.preload`, the app's module run,
`asgi.warm`), then processes forked from it, each running a warm-up of its own and then the app's
first request (`list_branches`), with their CPU time and minor page faults (copy-on-write of what
they touch) from `getrusage`. Warm-ups compared:

- none: the request meets every page the template built as shared;
- spare: `asgi.warm` again, as a spare does before it is claimed;
- spare + 422s: that, plus one request per route that FastAPI refuses before any of the app's code
  runs (a body that is not JSON, a path or query parameter of the wrong type, routes without
  dependencies only): the web stack's validation and error paths touched in the spare;
- spare + pages written ahead: the spare's warm-up, then the pages a probe wrote made this process's
  own (`firstpages.write_ahead`), as spares do under strict isolation; the probe is a fork that called
  every route but `list_branches` (1 for each path parameter), read by this process from /proc
  (`firstpages.written_pages`), so the pages come from other requests than the one measured;
- stand-in reads + spare + pages written ahead: as the last, but forked from a template that made one
  request to each GET route first (`standin`, as a worker's template does for an app that keeps nothing
  of a request: list_branches among them), on a private copy of the world;
- second request: the same request again (the baseline: what a process that served one pays).

Prints medians per warm-up (warm-up + request = what the process pays in all), and what one walk of the
app's state costs (`appstate.fingerprint`, which the template runs four times per world); the last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import time
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worldsmith.runtime.sandbox import appstate, asgi, firstpages  # noqa: E402


def _usage() -> tuple[float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return 1000 * (r.ru_utime + r.ru_stime), r.ru_minflt


def refused_requests(app: Any) -> None:
    """One request per route that FastAPI refuses (422) before the app's code runs; routes with
    dependencies (which run before validation) or nothing sure to fail are left out."""
    from fastapi.routing import APIRoute

    assert asgi.LOOP is not None
    for route in app.routes:
        if not isinstance(route, APIRoute) or route.dependant.dependencies:
            continue
        path, query, body = route.path_format, [], None
        for param in route.dependant.path_params:
            path = path.replace("{" + param.name + "}", "x")
        query = [(p.name, "x") for p in route.dependant.query_params if p.field_info.annotation in (int, bool)]
        if route.body_field is not None:
            body = b"{"
        elif not query and not any(p.field_info.annotation is int for p in route.dependant.path_params):
            continue
        status, _ = asgi.LOOP.run_until_complete(asgi._request(app, sorted(route.methods)[0], path, query, body))
        assert status == 422, (route.name, status)


def probed_pages(app: Any) -> bytes:
    """The pages a probe fork holds alone after calling every route but `list_branches` once (1 for
    each path parameter), read from /proc while it waits (`firstpages.written_pages`)."""
    routes = asgi.routes_of(app)
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        for name, route in routes.items():
            if name != "list_branches":
                asgi.call(app, route, {parameter: 1 for parameter in route.path_params})
        os.write(write, b"1")
        signal.pause()  # until killed, once its pages are read
        os._exit(0)
    os.close(write)
    os.read(read, 1)
    try:
        return firstpages.written_pages(pid, grandparent=os.getppid())
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(read)


def measure(app: Any, warm_up: Callable[[], None], forks: int) -> dict[str, float]:
    """Median CPU ms and faults of `warm_up` and then of the first request, in `forks` fresh forks."""
    route = asgi.routes_of(app)["list_branches"]
    rows = []
    for _ in range(forks):
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:
            c0, f0 = _usage()
            warm_up()
            c1, f1 = _usage()
            status, _ = asgi.call(app, route, {})
            c2, f2 = _usage()
            os.write(write, json.dumps([c1 - c0, f1 - f0, c2 - c1, f2 - f1, status]).encode())
            os._exit(0)
        os.close(write)
        rows.append(json.loads(os.read(read, 4096)))
        os.close(read)
        os.waitpid(pid, 0)
    assert all(row[4] == 200 for row in rows)
    keys = ("warm_cpu_ms", "warm_faults", "request_cpu_ms", "request_faults")
    return {key: statistics.median(row[i] for row in rows) for i, key in enumerate(keys)}


def with_stand_in_reads(app: Any, namespace: dict[str, Any], forks: int) -> dict[str, float]:
    """ "spare + pages written ahead" measured in a fork of this process that first made one request to
    each GET route of `app` (1 for each path parameter: the template's stand-in reads, kept out of this
    process's state), its pages probed after them, as a worker's template and probe do."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        for route in asgi.routes_of(app).values():
            if route.method == "GET":
                asgi.call(app, route, {parameter: 1 for parameter in route.path_params})
        pages = probed_pages(app)
        figures = measure(
            app, lambda: (asgi.warm(app, namespace), firstpages.write_ahead(pages, stop=lambda: False)), forks
        )
        os.write(write, json.dumps(figures).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while chunk := os.read(read, 65536):
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--forks", type=int, default=7)
    args = parser.parse_args()
    if args.forks < 1:
        parser.error("--forks must be at least 1")
    from awm_sessions import imported_world

    scenario, bundle = imported_world(ROOT / "tests" / "data" / "awm_format_sample")
    with tempfile.TemporaryDirectory() as scratch:
        world = Path(scratch) / "world.db"
        world.write_bytes(bundle.world)
        os.environ["DATABASE_PATH"] = f"sqlite:///{world}"
        asgi.preload()
        module = types.ModuleType("awm_app")
        sys.modules[module.__name__] = module
        exec(compile(scenario.app, "app.py", "exec"), module.__dict__)
        app, namespace = module.__dict__["app"], module.__dict__
        asgi.warm(app, namespace)
        route = asgi.routes_of(app)["list_branches"]
        pages = probed_pages(app)
        warm_ups: dict[str, Callable[[], None]] = {
            "none": lambda: None,
            "spare": lambda: asgi.warm(app, namespace),
            "spare + 422s": lambda: (asgi.warm(app, namespace), refused_requests(app)),
            "spare + pages written ahead": lambda: (
                asgi.warm(app, namespace),
                firstpages.write_ahead(pages, stop=lambda: False),
            ),
            "second request": lambda: asgi.call(app, route, {}) and None,
        }
        figures = {name: measure(app, warm_up, args.forks) for name, warm_up in warm_ups.items()}
        figures["stand-in reads + spare + pages"] = with_stand_in_reads(app, namespace, args.forks)
        walks = []  # what the template's check of the app's state costs (four walks per world and worker)
        for _ in range(5):
            started = time.perf_counter()
            records = appstate.fingerprint(namespace, module.__name__)
            walks.append(1000 * (time.perf_counter() - started))
        assert records is not None
        walk = {"records": len(records), "ms": statistics.median(walks)}
        figures["second request"] = figures.pop("second request")  # the baseline last
    print(f"load average {os.getloadavg()[0]:.1f}")
    print("warm-up in the fork (median)       warm-up: CPU ms, faults   request: CPU ms, faults   all: CPU ms, faults")
    for name, f in figures.items():
        print(
            f"  {name:<32}{f['warm_cpu_ms']:9.2f}{f['warm_faults']:8.0f}      {f['request_cpu_ms']:9.2f}"
            f"{f['request_faults']:8.0f}      {f['warm_cpu_ms'] + f['request_cpu_ms']:9.2f}"
            f"{f['warm_faults'] + f['request_faults']:8.0f}"
        )
    print(f"the app's state walked once (appstate.fingerprint): {walk['records']} records, {walk['ms']:.1f} ms")
    print(json.dumps({**figures, "walk": walk}))


if __name__ == "__main__":
    main()
