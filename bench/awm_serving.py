"""Serving an imported AgentWorldModel-1K environment: worldsmith against the reference way, in one run.

    .venv/bin/python bench/awm_serving.py [--release tests/data/awm_format_sample] [--episodes 10] [--calls 200]

worldsmith: the app runs in a sandbox worker and is called in-process (ASGI, no socket); an
episode reset is opening a fresh episode (a memory copy of the database). Reference: what the
release does, one uvicorn process per episode serving the app over HTTP on a fresh copy of the
database file; a reset is copying the file and starting the process until it answers, a tool
call an HTTP request. Same scenario, same calls (a read route and a write route).

Prints both latencies and the ratios (reference / worldsmith: above 1 means worldsmith is
faster); the last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
READ = ("list_branches", {})
WRITE = ("place_hold", {"book_id": 1, "pickup_branch_id": 2})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def worldsmith_side(bundle, episodes: int, calls: int) -> dict[str, float]:
    from worldsmith.runtime.episode import Runtime

    with Runtime(workers=1) as runtime:
        runtime.open_episode(bundle).close()  # start the worker and load the app once, like a running server
        resets = []
        for _ in range(episodes):
            started = time.perf_counter()
            episode = runtime.open_episode(bundle)
            resets.append(time.perf_counter() - started)
            episode.close()
        with runtime.open_episode(bundle) as episode:
            reads = _timed(lambda: episode.call_tool(*READ), calls)
            writes = []
            for _ in range(min(calls, 50)):
                episode.reset()
                started = time.perf_counter()
                result = episode.call_tool(*WRITE)
                writes.append(time.perf_counter() - started)
                assert result.ok, result.error
    return {
        "reset_ms": 1000 * statistics.median(resets),
        "read_ms": 1000 * statistics.median(reads),
        "write_ms": 1000 * statistics.median(writes),
    }


def _timed(call, n: int) -> list[float]:
    times = []
    for _ in range(n):
        started = time.perf_counter()
        result = call()
        times.append(time.perf_counter() - started)
        if hasattr(result, "ok"):
            assert result.ok, result.error
    return times


def reference_side(scenario, world: bytes, episodes: int, calls: int) -> dict[str, float]:
    """One uvicorn process per episode on a fresh copy of the database file (the release's way)."""
    routes = {e["operation_id"]: e for g in scenario.spec["api_groups"] for e in g["endpoints"]}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        (root / "awm_app.py").write_text(scenario.app)
        (root / "pristine.db").write_bytes(world)
        resets, reads, writes = [], [], []
        for index in range(episodes):
            started = time.perf_counter()
            database = root / f"episode-{index}.db"
            shutil.copyfile(root / "pristine.db", database)
            port = _free_port()
            env = {**os.environ, "DATABASE_PATH": f"sqlite:///{database}"}
            process = subprocess.Popen(
                [sys.executable, "-m", "uvicorn", "awm_app:app", "--port", str(port), "--log-level", "warning"],
                cwd=root,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            base = f"http://127.0.0.1:{port}"
            try:
                with httpx.Client(base_url=base, timeout=10) as client:
                    while True:
                        try:
                            client.get("/openapi.json")
                            break
                        except httpx.TransportError:
                            if process.poll() is not None:
                                raise RuntimeError("the reference server exited") from None
                            time.sleep(0.01)
                    resets.append(time.perf_counter() - started)
                    if index == 0:
                        reads = _timed(lambda: _http(client, routes[READ[0]], READ[1]), calls)
                    started = time.perf_counter()
                    _http(client, routes[WRITE[0]], WRITE[1])
                    writes.append(time.perf_counter() - started)
            finally:
                process.terminate()
                process.wait(10)
    return {
        "reset_ms": 1000 * statistics.median(resets),
        "read_ms": 1000 * statistics.median(reads),
        "write_ms": 1000 * statistics.median(writes),
    }


def _http(client: httpx.Client, endpoint: dict, arguments: dict) -> object:
    response = client.request(
        endpoint["method"],
        endpoint["path"],
        json=arguments if endpoint["method"] != "GET" else None,
        params=arguments if endpoint["method"] == "GET" else None,
    )
    response.raise_for_status()
    return response.json()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--release", type=Path, default=REPO / "tests" / "data" / "awm_format_sample")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()

    from worldsmith.interop.awm import import_scenario, read_release
    from worldsmith.runtime.episode import Runtime

    scenario = read_release(args.release)[0]
    with Runtime(workers=1) as runtime:
        bundle = import_scenario(scenario, runtime).bundle
    assert bundle is not None
    ours = worldsmith_side(bundle, args.episodes, args.calls)
    theirs = reference_side(scenario, bundle.world, args.episodes, args.calls)
    ratios = {key: theirs[key] / ours[key] for key in ours}
    for key in ours:
        print(
            f"{key[:-3]:>6}: worldsmith {ours[key]:8.3f} ms, reference (uvicorn per episode) {theirs[key]:8.3f} ms, x{ratios[key]:.1f}"
        )
    print(
        json.dumps(
            {
                "scenario": scenario.key,
                "episodes": args.episodes,
                "calls": args.calls,
                "worldsmith": ours,
                "reference": theirs,
                "ratio_reference_over_worldsmith": ratios,
            }
        )
    )


if __name__ == "__main__":
    main()
