"""Where a new episode's first call, and a new MCP session plus one read, spend their time (issue 32).

    .venv/bin/python bench/session_breakdown.py [--episodes 30] [--sessions 20] [--only runtime gateway]

runtime: under strict isolation, episodes of a native world (the golden bundle, `get_customer`) and
of an imported one (the vendored AWM sample, a FastAPI app, `list_branches`) opened, called twice
and closed in turn, one worker. Per episode: the open (claiming a spare: its readiness, the
hand-over of its pipes), the first call, the second call (the same call in a process that served
one: the baseline of the first), the close; and, read from /proc of the episode's process around
the first call, its CPU time and minor page faults (copy-on-write of what the call touches), and
the CPU the process had spent before it (fork, confinement, database, warm-up). Ratios: imported /
native per phase, first / second call per world.

gateway: the imported world served by `serving.gateway.serve` and by the reference (the MCP SDK's
server, the app called in-process: `bench/awm_sessions.py`), and the floor (canned answers under the
same uvicorn: what the client and the HTTP stack cost), each in a process of its own; a light
client's new session split into `initialize` (ours opens the episode there), `notifications/initialized`
and the read (the episode's first call), taken in turn against both, with ratios ours / reference.

Medians; the last line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from awm_sessions import imported_world, light_session, served  # noqa: E402
from echo_world import GOLDEN  # noqa: E402

from worldsmith.bundle.contract import Bundle  # noqa: E402
from worldsmith.bundle.loader import load_bundle  # noqa: E402
from worldsmith.interop.awm import AwmScenario  # noqa: E402
from worldsmith.runtime.episode import Runtime  # noqa: E402
from worldsmith.runtime.limits import SandboxLimits  # noqa: E402

RUNTIME_PHASES = (
    "open_ms",
    "first_call_ms",
    "second_call_ms",
    "close_ms",
    "first_call_cpu_ms",
    "first_call_faults",
    "second_call_cpu_ms",
    "second_call_faults",
    "spare_cpu_ms",
    "spare_faults",
)


def _proc(pid: int | None) -> tuple[float, int]:
    """(CPU milliseconds, minor page faults) of process `pid` so far, from /proc (schedstat's time on
    a CPU, in ns: stat's ticks are too coarse); (nan, -1) if gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        on_cpu_ns = int(Path(f"/proc/{pid}/schedstat").read_text().split()[0])
    except (OSError, TypeError):
        return float("nan"), -1
    # after the name: state(0) ppid pgrp session tty tpgid flags minflt(7)
    return on_cpu_ns / 1e6, int(fields[7])


def runtime_breakdown(
    worlds: dict[str, tuple[Bundle, str, dict]], episodes: int, settle: bool
) -> dict[str, dict[str, float]]:
    """Median of each phase per world, the worlds' episodes taken in turn (one strict runtime each;
    `settle`: after each close, wait until the worker's spares are forked, ready and warm: `SandboxWorker.spares_at_rest`)."""
    samples = {name: {phase: [] for phase in RUNTIME_PHASES} for name in worlds}
    limits = dataclasses.replace(SandboxLimits.from_settings(), isolation="strict")
    runtimes = {name: Runtime(limits=limits, workers=1) for name in worlds}
    try:
        for round_ in range(episodes + 2):  # the first two: warm-up (the worker and its template start)
            for name, (bundle, tool, arguments) in worlds.items():
                runtime, took = runtimes[name], samples[name]
                start = time.perf_counter()
                episode = runtime.open_episode(bundle)
                opened = time.perf_counter()
                pid = episode._worker.channel_pid(episode.id)
                cpu0, faults0 = _proc(pid)
                assert episode.call_tool(tool, arguments).ok
                called = time.perf_counter()
                cpu1, faults1 = _proc(pid)
                assert episode.call_tool(tool, arguments).ok
                again = time.perf_counter()
                cpu2, faults2 = _proc(pid)
                episode.close()
                closed = time.perf_counter()
                if settle:
                    episode._worker.spares_at_rest(10.0)
                if round_ < 2:
                    continue
                for phase, value in (
                    ("open_ms", opened - start),
                    ("first_call_ms", called - opened),
                    ("second_call_ms", again - called),
                    ("close_ms", closed - again),
                ):
                    took[phase].append(1000 * value)
                for phase, value in (
                    ("first_call_cpu_ms", cpu1 - cpu0),
                    ("first_call_faults", faults1 - faults0),
                    ("second_call_cpu_ms", cpu2 - cpu1),
                    ("second_call_faults", faults2 - faults1),
                    ("spare_cpu_ms", cpu0),
                    ("spare_faults", faults0),
                ):
                    took[phase].append(value)
    finally:
        for runtime in runtimes.values():
            runtime.close()
    return {
        name: {
            phase: statistics.median([v for v in values if v == v and v >= 0] or [float("nan")])
            for phase, values in by.items()
        }
        for name, by in samples.items()
    }


def gateway_breakdown(scenario: AwmScenario, bundle: Bundle, sessions: int) -> dict[str, dict[str, float]]:
    """Median milliseconds of a light session's three requests, ours and the reference's in turn."""
    kinds = ("initialize_ms", "initialized_ms", "read_ms", "session_ms")
    with served(scenario, bundle) as urls:
        for url in urls.values():
            for _ in range(3):
                light_session(url)
        samples = {name: {kind: [] for kind in kinds} for name in urls}
        for _ in range(sessions):
            for name, url in urls.items():
                parts = light_session(url)
                for kind, value in zip(kinds, (*parts, sum(parts)), strict=True):
                    samples[name][kind].append(1000 * value)
    return {name: {k: statistics.median(v) for k, v in by.items()} for name, by in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--only", nargs="+", choices=("runtime", "gateway"), default=["runtime", "gateway"])
    parser.add_argument(
        "--settle",
        action="store_true",
        help="runtime: each episode opened with its spares ready and warm (`SandboxWorker.spares_at_rest`)",
    )
    args = parser.parse_args()
    for name in ("episodes", "sessions"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    scenario, imported = imported_world(ROOT / "tests" / "data" / "awm_format_sample")
    results: dict[str, object] = {"load_average": os.getloadavg()[0]}
    print(f"load average {os.getloadavg()[0]:.1f}", flush=True)
    if "runtime" in args.only:
        worlds = {
            "native": (load_bundle(GOLDEN), "get_customer", {"customer_id": 1}),
            "imported": (imported, "list_branches", {}),
        }
        figures = runtime_breakdown(worlds, args.episodes, args.settle)
        results["runtime"] = figures
        native, ours = figures["native"], figures["imported"]
        print("strict isolation, an episode (median)      native     imported  imported/native")
        for phase in RUNTIME_PHASES:
            unit = "" if phase.endswith("faults") else " ms"
            label = phase.removesuffix("_ms").replace("_", " ")
            ratio = f"x{ours[phase] / native[phase]:.2f}" if native[phase] > 0 else "-"
            print(f"  {label:<38}{native[phase]:9.2f}{unit:3}{ours[phase]:9.2f}{unit:3}  {ratio}")
        for name, world in figures.items():
            print(f"  {name}: first call / second call x{world['first_call_ms'] / world['second_call_ms']:.2f}")
        opened = (ours["open_ms"] + ours["first_call_ms"]) / (native["open_ms"] + native["first_call_ms"])
        print(f"  imported / native, open + first call: x{opened:.2f}")
    if "gateway" in args.only:
        figures = gateway_breakdown(
            *imported_world(ROOT / "tests" / "data" / "awm_format_sample"), args.sessions
        )  # a bundle not run yet: it pickles
        results["gateway"] = figures
        ours, theirs, floor = figures["worldsmith"], figures["reference"], figures["floor"]
        print(
            "new MCP session + one read, light client (median)   worldsmith   reference   ours/reference"
            "      floor  floor/reference"
        )
        for kind in ("initialize_ms", "initialized_ms", "read_ms", "session_ms"):
            print(
                f"  {kind.removesuffix('_ms'):<48}{ours[kind]:9.2f} ms{theirs[kind]:9.2f} ms  x{ours[kind] / theirs[kind]:.2f}"
                f"        {floor[kind]:7.2f} ms  x{floor[kind] / theirs[kind]:.2f}"
            )
        print("  (target: the whole session at most x0.5 the reference's; the floor: canned answers, no server work)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
