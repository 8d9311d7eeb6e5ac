"""Generation throughput against an LLM with a fixed latency; every figure is measured in this run.

    .venv/bin/python bench/generation.py [--count 8] [--concurrency 4] [--latency 5.0]

A local OpenAI-compatible server answers each stage with procedural content after `latency`
seconds. The `generate` flow (openai backend, Prefect test server) builds `count` environments
with `concurrency` in parallel. The ideal wall time is the LLM time alone: one scenario call,
then six stage calls per environment, `concurrency` environments at a time. Prints environments
per hour (measured and ideal), pipeline overhead (target <= 10%), the CPU seconds the run used (this
process and every process it started: sandbox workers, episode processes, the Prefect server; the model
server only sleeps), which load inflates less than wall time, the seconds each stage took beyond its
model calls (mean over environments: the checks on the critical path), and per environment: LLM calls,
tokens and cost. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

STAGE_CALLS = 6  # tasks, schema, seed, tool plan, tool code, verifiers


def tree_cpu_s() -> float:
    """CPU seconds used so far by this process and the processes it started, ended ones included (those
    a live descendant reaped count in its children's times, those this process reaped in its own)."""
    import psutil

    me = psutil.Process()
    own, total = os.times(), 0.0
    total += own.user + own.system + own.children_user + own.children_system
    for process in me.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--latency", type=float, default=5.0)
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="worldsmith-bench-gen-"))
    os.environ["WORLDSMITH_HOME"] = str(home)
    os.environ["WORLDSMITH_LLM_PRICES"] = json.dumps({"bench-model": {"input": 0.4, "output": 1.6}})
    from llm_server import ProceduralLLM
    from prefect.testing.utilities import prefect_test_harness
    from sqlmodel import select

    from worldsmith.flows.generate import run_generate
    from worldsmith.models.catalog import StageAttempt
    from worldsmith.settings import get_settings
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.tasks.parameters import GenerateParameters

    server = ProceduralLLM(latency_s=args.latency)
    with server.serve() as background, prefect_test_harness(server_startup_timeout=120):
        os.environ["WORLDSMITH_LLM_BASE_URL"] = f"{background.url}/v1"
        os.environ["WORLDSMITH_LLM_API_KEY"] = "sk-bench"
        os.environ["WORLDSMITH_LLM_CONCURRENCY"] = str(max(8, args.concurrency * 2))
        get_settings.cache_clear()
        params = GenerateParameters(
            count=args.count, backend="openai", model="bench-model", concurrency=args.concurrency, seed=1
        )
        started, cpu_started = time.perf_counter(), tree_cpu_s()
        results = run_generate(params)
        wall, cpu = time.perf_counter() - started, tree_cpu_s() - cpu_started
    good = sum(r.status == "good" for r in results)
    ideal = args.latency * (1 + math.ceil(args.count / args.concurrency) * STAGE_CALLS)
    with open_catalog().session() as session:
        attempts = session.exec(select(StageAttempt)).all()
    calls = len(server.served)
    beyond: dict[str, list[float]] = {}
    for a in attempts:  # every attempt of these runs makes one model call (validate makes none)
        beyond.setdefault(a.stage, []).append(a.seconds - (0.0 if a.stage == "validate" else args.latency))
    figures = {
        "environments": args.count,
        "good": good,
        "concurrency": args.concurrency,
        "latency_s": args.latency,
        "wall_s": round(wall, 2),
        "ideal_s": round(ideal, 2),
        "envs_per_hour": round(args.count / wall * 3600, 1),
        "ideal_envs_per_hour": round(args.count / ideal * 3600, 1),
        "overhead": round(wall / ideal - 1, 4),
        "cpu_s": round(cpu, 1),
        "stage_seconds_beyond_calls": {stage: round(sum(v) / len(v), 2) for stage, v in beyond.items()},
        "llm_calls_per_env": round(calls / args.count, 2),
        "tokens_per_env": round(sum(a.tokens_in + a.tokens_out for a in attempts) / args.count, 1),
        "cost_usd_per_env": round(sum(a.cost_usd for a in attempts) / args.count, 6),
    }
    print(
        f"{good}/{args.count} environments good in {wall:.1f} s; ideal {ideal:.1f} s "
        f"({figures['envs_per_hour']} vs {figures['ideal_envs_per_hour']} envs/hour; "
        f"overhead {figures['overhead']:.1%}, target <= 10%)"
    )
    print(f"CPU: {figures['cpu_s']} s in all processes of the run ({cpu / args.count:.1f} s per environment)")
    print(
        "seconds beyond the model call, per stage: "
        + ", ".join(f"{stage} {value}" for stage, value in figures["stage_seconds_beyond_calls"].items())
    )
    print(
        f"per environment: {figures['llm_calls_per_env']} LLM calls, {figures['tokens_per_env']} tokens, "
        f"${figures['cost_usd_per_env']}"
    )
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
