"""Runtime throughput: sandboxed tool calls per second with many concurrent sessions (issue 24).

    .venv/bin/python bench/runtime_load.py [--sessions 1 8 32] [--seconds 3] [--workers 2] [--isolation strict]
    .venv/bin/python bench/runtime_load.py --profile [--calls 2000] [--isolation strict]

Each session is one episode of the golden bundle and one thread calling a read tool back to back;
the figure is completed calls per second over all sessions, with the latency p50/p99 of one call.
`runtime_calls_per_second` is the measurement, importable by other benchmarks (bench/gateway.py):
the load generator runs in the runtime's own process, as a caller of the in-process runtime does.
`--profile` instead profiles one session's calls end to end with cProfile: in this process and in
the process running the code (strict isolation: the episode's own process; fast: the worker), each
printed by internal time.
Beside the wall-clock rate it reports the CPU time one call costs in all processes together (this one,
the workers and their episode processes) and `cpu_bound_calls_per_second`, the rate two cores give
at that cost: the figure to read on a machine shared with other work, where the wall rate is not ours.
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import json
import os
import pstats
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from echo_world import GOLDEN, count  # noqa: E402  (bench/ is on the path when a bench runs)

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.runtime import worker_launch
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.limits import SandboxLimits

#: The call every session repeats: a read tool of the golden bundle.
CALL = ("get_product", {"sku": "KB-101"})


def _cpu_seconds(runtime: Runtime) -> float:
    """CPU seconds used so far by this process, the runtime's workers and their live episode processes."""
    total = sum(os.times()[:2])
    for worker in runtime.pool.workers():
        try:
            process = psutil.Process(worker.pid)
            for each in [process, *process.children(recursive=True)]:
                times = each.cpu_times()
                total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def runtime_calls_per_second(
    runtime: Runtime,
    bundle: Bundle,
    sessions: int,
    *,
    seconds: float = 3.0,
    call: tuple[str, dict[str, Any]] = CALL,
) -> dict[str, float]:
    """Tool calls per second through `runtime` with `sessions` concurrent sessions (an episode and a
    thread each) calling `call` back to back for `seconds`; episodes are opened and warmed (one call)
    before the clock starts. Returns calls_per_second, p50_ms, p99_ms, calls, the sessions count,
    cpu_us_per_call (all processes) and cpu_bound_calls_per_second (two cores' worth of CPU at that
    cost); every call must succeed (AssertionError otherwise)."""
    tool, arguments = call
    episodes = [runtime.open_episode(bundle) for _ in range(sessions)]
    try:
        for episode in episodes:
            assert episode.call_tool(tool, arguments).ok
        start = threading.Barrier(sessions + 1)
        stop = threading.Event()
        latencies: list[list[float]] = [[] for _ in episodes]
        failures: list[str] = []

        def session(index: int) -> None:
            episode, samples = episodes[index], latencies[index]
            start.wait()
            while not stop.is_set():
                began = time.perf_counter()
                result = episode.call_tool(tool, arguments)
                samples.append(time.perf_counter() - began)
                if not result.ok:
                    failures.append(f"{result.status}: {result.error}")
                    return

        threads = [threading.Thread(target=session, args=(i,), daemon=True) for i in range(sessions)]
        for thread in threads:
            thread.start()
        cpu = _cpu_seconds(runtime)
        start.wait()
        began = time.perf_counter()
        time.sleep(seconds)
        stop.set()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - began
        cpu = _cpu_seconds(runtime) - cpu
        assert not failures, failures[:3]
    finally:
        for episode in episodes:
            episode.close()
    samples = sorted(s for each in latencies for s in each)
    return {
        "sessions": sessions,
        "calls": len(samples),
        "calls_per_second": len(samples) / wall,
        "p50_ms": statistics.median(samples) * 1e3,
        "p99_ms": samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3,
        "cpu_us_per_call": cpu / len(samples) * 1e6,
        "cpu_bound_calls_per_second": 2 * len(samples) / cpu,
    }


def throughput(
    sessions: list[int], *, seconds: float = 3.0, workers: int = 2, isolation: str = "strict"
) -> dict[str, dict[str, float]]:
    """`runtime_calls_per_second` on the golden bundle at each count of `sessions`, in one runtime
    of `workers` sandbox workers under `isolation`; keyed `runtime_calls_per_second_<sessions>`."""
    golden = load_bundle(GOLDEN)
    limits = dataclasses.replace(SandboxLimits.from_settings(), isolation=isolation)
    results = {}
    with Runtime(limits=limits, workers=workers) as runtime:
        for count in sessions:
            results[f"runtime_calls_per_second_{count}"] = runtime_calls_per_second(
                runtime, golden, count, seconds=seconds
            )
    return results


#: Worker bootstrap with a profiler around the handling of tool calls: in the worker itself ("worker")
#: or in the episode's process ("episode"), after `warm` calls; stats written as prof.out into the
#: directory that process may write (the worker's scratch, the episode's directory) once `calls` are in.
_PROFILED_BOOTSTRAP = """
import sys; sys.path.insert(0, sys.argv[2])
import cProfile, os
from worldsmith.runtime.sandbox import worker as W
_handle, _profile, _seen = W.Worker.handle, cProfile.Profile(), [0]
def handle(self, header, blobs):
    if header.get("op") != "call" or self.run_process != ({role!r} == "episode"):
        return _handle(self, header, blobs)
    _seen[0] += 1
    if _seen[0] <= {warm}:
        return _handle(self, header, blobs)
    _profile.enable()
    try:
        return _handle(self, header, blobs)
    finally:
        _profile.disable()
        if _seen[0] == {warm} + {calls}:
            where = self.operations.episodes[header["episode"]].directory if {role!r} == "episode" else self.operations.scratch
            os.makedirs(where, exist_ok=True)
            _profile.dump_stats(os.path.join(where, "prof.out"))
W.Worker.handle = handle
W.main()
"""


def profile(calls: int, isolation: str, lines: int = 25) -> None:
    """Print where one session's `calls` tool calls spend their time: in this process, and in the
    process that runs the code (strict: the episode's own process, the worker being off the call
    path once the episode's channel is direct; fast: the worker)."""
    golden = load_bundle(GOLDEN)
    limits = dataclasses.replace(SandboxLimits.from_settings(), isolation=isolation)
    warm, plain = 100, worker_launch._BOOTSTRAP
    role = "episode" if isolation == "strict" else "worker"
    with Runtime(limits=limits, workers=1) as runtime:
        worker_launch._BOOTSTRAP = _PROFILED_BOOTSTRAP.format(role=role, warm=warm, calls=calls)
        try:
            episode = runtime.open_episode(golden)  # starts the worker: the profiled bootstrap
        finally:
            worker_launch._BOOTSTRAP = plain
        for _ in range(warm):
            assert episode.call_tool(*CALL).ok
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(calls):
            assert episode.call_tool(*CALL).ok
        profiler.disable()
        print(f"== parent ({calls} calls, {isolation})", flush=True)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(lines)
        stats = next(Path(runtime.pool.scratch_root).rglob("prof.out"))
        print(f"== {role} process ({calls} calls, {isolation})", flush=True)
        pstats.Stats(str(stats)).sort_stats("tottime").print_stats(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=count, nargs="+", default=[1, 8, 32])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--isolation", choices=("strict", "fast"), default="strict")
    parser.add_argument("--profile", action="store_true", help="profile one session's calls in every process")
    parser.add_argument("--calls", type=int, default=2000, help="calls profiled (--profile)")
    args = parser.parse_args()
    if args.profile:
        profile(args.calls, args.isolation)
        return
    print(f"load average before: {' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    results = throughput(args.sessions, seconds=args.seconds, workers=args.workers, isolation=args.isolation)
    for r in results.values():
        print(
            f"{r['sessions']:>3} sessions ({args.isolation}, {args.workers} workers): {r['calls_per_second']:,.0f} "
            f"calls/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms; CPU {r['cpu_us_per_call']:.0f} us/call "
            f"in all processes: {r['cpu_bound_calls_per_second']:,.0f} calls/s on 2 cores (target >= 5,000 calls/s)",
            flush=True,
        )
    print(json.dumps({k: {m: round(v, 4) for m, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
