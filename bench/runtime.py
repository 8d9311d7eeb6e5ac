"""Runtime benchmarks; each figure is a ratio or a bound measured in this same run.

    .venv/bin/python bench/runtime.py [--calls N] [--episodes N]

Prints one line per figure and, last, a JSON object with all of them:
- tool_call_overhead_<isolation>: a tool call through the sandboxed runtime vs the same function
  called directly on an in-process SQLite connection, in each isolation mode (docs/security.md);
  under strict isolation also an episode's first call (which forks the episode's process) and a
  verification (a process of its own), against the same calls under fast isolation;
- gateway_vs_sdk: MCP tool-call latency through the worldsmith gateway (sandboxed echo tool) vs
  the plain `mcp` SDK (MCPServer) serving an equivalent echo tool, both over streamable HTTP, one
  session (bench/echo_world.py; throughput at 1-128 sessions: bench/gateway.py);
- reset: restoring a ~1 MB world.db by deserialize (what episodes do) vs copying the file and
  opening a new connection;
- open_1024_<world>_<isolation>: opening 1,024 episodes at once from 32 threads (wall time, peak RSS
  of the parent plus its workers and their processes), on the golden bundle and on a ~1 MB world,
  in each isolation mode;
- imported_first_call_strict: under strict isolation, an episode's first call of an imported AWM
  world (the vendored sample, a FastAPI app: open + call + close, and a write right after a reset)
  against a native world's (the golden bundle: open + call + close; and the first call alone, without
  the open and the close); target: within 2x.

`--only` runs some of the figures (tool_call, gateway, reset, open, imported); all by default.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anyio
import psutil
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from echo_world import GOLDEN, echo_world, sdk_echo_app, variant

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.bundle.sqlscript import deserialize, harden
from worldsmith.localserver import BackgroundServer
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.serving.gateway import Gateway


def megabyte_world(golden: Bundle) -> Bundle:
    rows = ",\n".join(
        f"({100 + i}, 'Bench Customer {i:05d} with a longer display name', 'bench{i:05d}@example.com', 'bronze', {i % 500}, '2025-01-01')"
        for i in range(9000)
    )
    return variant(
        golden,
        "retail_store_1mb",
        extra_seed=f"\nINSERT INTO customers (id, name, email, tier, loyalty_points, created_at) VALUES\n{rows};\n",
    )


def timed(fn, repeat: int) -> float:
    """Median seconds of `fn` over `repeat` runs (after one warm-up)."""
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


ISOLATIONS = ("strict", "fast")


def runtime_with(isolation: str, workers: int) -> Runtime:
    return Runtime(limits=dataclasses.replace(SandboxLimits.from_settings(), isolation=isolation), workers=workers)


def bench_tool_call(runtime: Runtime, golden: Bundle, big: Bundle, calls: int) -> dict[str, float]:
    namespace: dict = {}
    exec(compile(golden.text("tools.py"), "tools.py", "exec"), namespace)
    conn = deserialize(golden.world)
    conn.row_factory = sqlite3.Row
    direct = timed(lambda: namespace["get_product"](conn, "KB-101"), calls)
    task = golden.tasks[0].id
    with runtime.open_episode(golden, task) as episode:
        sandboxed = timed(lambda: episode.call_tool("get_product", {"sku": "KB-101"}), calls)
        verify = timed(lambda: episode.verify(""), max(calls // 10, 10))

    def first_call() -> None:  # an episode of the 1.24 MB world opened, called once, closed
        with runtime.open_episode(big) as fresh:
            fresh.call_tool("get_customer", {"customer_id": 1})

    first = timed(first_call, max(calls // 10, 10))
    return {
        "direct_us": direct * 1e6,
        "runtime_us": sandboxed * 1e6,
        "ratio": sandboxed / direct,
        "overhead_us": (sandboxed - direct) * 1e6,
        "first_call_1mb_ms": first * 1e3,
        "verify_ms": verify * 1e3,
    }


def bench_imported_first_call(golden: Bundle, calls: int) -> dict[str, float]:
    """Strict isolation: an imported (ASGI) world's first calls against a native world's, one worker
    each; episodes opened back to back (each right after the last closed: the worker's spares are
    still being forked and warmed), and at rest (each after its worker's spares are ready and warm:
    `SandboxWorker.spares_at_rest`)."""
    from worldsmith.interop.awm import import_scenario, read_release

    (scenario,) = read_release(ROOT / "tests" / "data" / "awm_format_sample")
    with Runtime(workers=1) as runtime:
        imported = import_scenario(scenario, runtime).bundle
    assert imported is not None
    repeat = max(calls // 10, 10)
    figures = {}
    with runtime_with("strict", 1) as runtime:
        for name, bundle, tool, arguments in (
            ("native", golden, "get_customer", {"customer_id": 1}),
            ("imported", imported, "list_branches", {}),
        ):
            for arrivals in ("", "_at_rest"):
                whole: list[float] = []  # open + call + close
                alone: list[float] = []  # the first call itself
                for round_ in range(repeat + 1):  # the first: a warm-up (the worker and its template start)
                    start = time.perf_counter()
                    with runtime.open_episode(bundle) as fresh:
                        called = time.perf_counter()
                        assert fresh.call_tool(tool, arguments).ok
                        answered = time.perf_counter()
                        worker = fresh._worker
                    if round_:
                        whole.append(time.perf_counter() - start)
                        alone.append(answered - called)
                    if arrivals:
                        worker.spares_at_rest(10.0)
                figures[f"{name}_first_call{arrivals}_ms"] = statistics.median(whole) * 1e3
                figures[f"{name}_first_call_alone{arrivals}_ms"] = statistics.median(alone) * 1e3
    with runtime_with("strict", 1) as runtime, runtime.open_episode(imported) as episode:
        writes = []  # as bench/awm_serving.py times it: the write alone, right after a reset
        for _ in range(repeat + 1):
            episode.reset()
            start = time.perf_counter()
            assert episode.call_tool("place_hold", {"book_id": 1, "pickup_branch_id": 2}).ok
            writes.append(time.perf_counter() - start)
        figures["imported_write_after_reset_ms"] = statistics.median(writes[1:]) * 1e3
    for arrivals in ("", "_at_rest"):
        for part in ("", "_alone"):
            figures[f"ratio{part}{arrivals}"] = (
                figures[f"imported_first_call{part}{arrivals}_ms"] / figures[f"native_first_call{part}{arrivals}_ms"]
            )
    return figures


async def _mcp_latency(url: str, tool: str, calls: int) -> float:
    async with streamable_http_client(url) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        await session.list_tools()
        for _ in range(10):
            await session.call_tool(tool, {"text": "warm"})
        samples = []
        for i in range(calls):
            start = time.perf_counter()
            result = await session.call_tool(tool, {"text": f"hello {i}"})
            samples.append(time.perf_counter() - start)
            assert not result.is_error
        return statistics.median(samples)


def bench_gateway(runtime: Runtime, golden: Bundle, calls: int) -> dict[str, float]:
    with BackgroundServer(sdk_echo_app()) as sdk_server:
        sdk = anyio.run(_mcp_latency, f"{sdk_server.url}/mcp", "echo", calls)
    with BackgroundServer(Gateway(runtime, [echo_world(golden)]).app()) as gateway_server:
        ours = anyio.run(_mcp_latency, f"{gateway_server.url}/envs/echo_env/mcp", "echo", calls)
    return {"sdk_ms": sdk * 1e3, "gateway_ms": ours * 1e3, "ratio": ours / sdk}


def bench_reset(world: bytes, repeat: int) -> dict[str, float]:
    tmp = Path(tempfile.mkdtemp(prefix="worldsmith-bench-"))
    source = tmp / "world.db"
    source.write_bytes(world)
    conn = deserialize(world)

    def by_deserialize() -> None:
        sqlite3.Connection.set_authorizer(conn, None)
        sqlite3.Connection.deserialize(conn, world)
        harden(conn)
        conn.execute("SELECT count(*) FROM customers").fetchone()

    def by_file_copy() -> None:
        target = tmp / "episode.db"
        shutil.copyfile(source, target)
        fresh = sqlite3.connect(target)
        harden(fresh)
        fresh.execute("SELECT count(*) FROM customers").fetchone()
        fresh.close()

    memory = timed(by_deserialize, repeat)
    files = timed(by_file_copy, repeat)
    shutil.rmtree(tmp)
    return {
        "world_bytes": len(world),
        "deserialize_ms": memory * 1e3,
        "file_copy_ms": files * 1e3,
        "speedup": files / memory,
    }


def _rss(runtime: Runtime) -> int:
    """Resident memory of this process plus every sandbox worker of `runtime` and its processes."""
    total = psutil.Process().memory_info().rss
    for worker in runtime.pool.workers():
        try:
            process = psutil.Process(worker.pid)
            for each in [process, *process.children(recursive=True)]:
                total += each.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total


def bench_open(bundle: Bundle, count: int, workers: int, isolation: str) -> dict[str, float]:
    with runtime_with(isolation, workers) as runtime:
        warm = runtime.open_episode(bundle)  # workers started and the env loaded: not part of the figure
        warm.close()
        base_rss = _rss(runtime)
        peak = [base_rss]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], _rss(runtime))
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        start = time.perf_counter()
        with ThreadPoolExecutor(max_workers=32) as pool:
            episodes = list(pool.map(lambda _: runtime.open_episode(bundle), range(count)))
        wall = time.perf_counter() - start
        peak[0] = max(peak[0], _rss(runtime))
        done.set()
        sampler.join()
        assert runtime.open_episodes == count
        probe = episodes[-1].call_tool("get_customer", {"customer_id": 1})
        assert probe.ok
    return {
        "episodes": count,
        "world_bytes": len(bundle.world),
        "wall_s": wall,
        "peak_rss_mb": peak[0] / 2**20,
        "rss_growth_mb": (peak[0] - base_rss) / 2**20,
    }


FIGURES = ["tool_call", "gateway", "reset", "open", "imported"]


def tool_call_figures(
    results: dict[str, dict[str, float]], golden: Bundle, big: Bundle, calls: int, workers: int
) -> None:
    for isolation in ISOLATIONS:
        with runtime_with(isolation, workers) as runtime:
            r = results[f"tool_call_overhead_{isolation}"] = bench_tool_call(runtime, golden, big, calls)
        print(
            f"tool call ({isolation}): direct {r['direct_us']:.1f} us, through runtime {r['runtime_us']:.1f} us "
            f"(x{r['ratio']:.1f}, overhead {r['overhead_us']:.0f} us; target < 1000 us); first call of an episode "
            f"of the 1.24 MB world (open + call + close) {r['first_call_1mb_ms']:.2f} ms; verify {r['verify_ms']:.2f} ms",
            flush=True,
        )
    strict, fast = results["tool_call_overhead_strict"], results["tool_call_overhead_fast"]
    results["strict_vs_fast"] = {
        "call": strict["runtime_us"] / fast["runtime_us"],
        "first_call": strict["first_call_1mb_ms"] / fast["first_call_1mb_ms"],
        "verify": strict["verify_ms"] / fast["verify_ms"],
    }
    print(
        "strict / fast: call x{call:.2f}, first call x{first_call:.2f}, verify x{verify:.2f}".format(
            **results["strict_vs_fast"]
        ),
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=500)
    parser.add_argument("--episodes", type=int, default=1024)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--only", nargs="+", choices=FIGURES, default=FIGURES, help="the figures to run")
    args = parser.parse_args()
    for name in ("calls", "episodes", "workers"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")

    golden = load_bundle(GOLDEN)
    big = megabyte_world(golden)
    results: dict[str, dict[str, float]] = {}
    if "tool_call" in args.only:
        tool_call_figures(results, golden, big, args.calls, args.workers)
    if "gateway" in args.only:
        with Runtime(workers=args.workers) as runtime:
            results["gateway_vs_sdk"] = bench_gateway(runtime, golden, max(50, args.calls // 5))
        print(
            f"MCP call: plain SDK {results['gateway_vs_sdk']['sdk_ms']:.2f} ms, gateway "
            f"{results['gateway_vs_sdk']['gateway_ms']:.2f} ms (x{results['gateway_vs_sdk']['ratio']:.2f}; target <= 1.5)",
            flush=True,
        )
    if "reset" in args.only:
        results["reset"] = bench_reset(big.world, 200)
        print(
            f"reset of a {results['reset']['world_bytes'] / 2**20:.2f} MB world: deserialize {results['reset']['deserialize_ms']:.3f} ms, "
            f"file copy + connect {results['reset']['file_copy_ms']:.3f} ms (x{results['reset']['speedup']:.1f} faster; target < 1 ms)",
            flush=True,
        )
    if "open" in args.only:
        for name, bundle in (("golden", golden), ("1mb", big)):
            for isolation in ISOLATIONS:
                r = results[f"open_1024_{name}_{isolation}"] = bench_open(
                    bundle, args.episodes, args.workers, isolation
                )
                print(
                    f"open {r['episodes']} episodes of a {r['world_bytes'] / 2**20:.2f} MB world ({isolation}): "
                    f"{r['wall_s']:.2f} s, peak RSS {r['peak_rss_mb']:.0f} MB (targets < 2 s, < 2048 MB)",
                    flush=True,
                )
    if "imported" in args.only:
        r = results["imported_first_call_strict"] = bench_imported_first_call(golden, args.calls)
        for arrivals, how in (("", "back to back"), ("_at_rest", "at rest")):
            print(
                f"first call (strict, open + call + close; episodes {how}): native "
                f"{r[f'native_first_call{arrivals}_ms']:.2f} ms, imported {r[f'imported_first_call{arrivals}_ms']:.2f} ms "
                f"(x{r[f'ratio{arrivals}']:.1f}; target <= 2); the call alone: native "
                f"{r[f'native_first_call_alone{arrivals}_ms']:.2f} ms, imported "
                f"{r[f'imported_first_call_alone{arrivals}_ms']:.2f} ms (x{r[f'ratio_alone{arrivals}']:.1f})"
            )
        print(f"imported write after a reset {r['imported_write_after_reset_ms']:.2f} ms", flush=True)
    print(json.dumps({k: {m: round(v, 4) for m, v in r.items()} for k, r in results.items()}))


if __name__ == "__main__":
    main()
