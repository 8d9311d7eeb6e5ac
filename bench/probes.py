"""Execution probes against planted faults: the share found per fault class, the false positives on
clean worlds, and the probes' time per world.

    .venv/bin/python bench/probes.py [--seeds 1] [--domains all] [--faults all]

Clean worlds: the golden bundle, procedural worlds (every domain, `--seeds` each) and the AWM-format
sample imported. Each must pass every probe (a failed probe on a clean world is a false positive).
Planted: each procedural world once per fault class of worldsmith/llm/procedural/faults.py; a fault is
found when a failed probe names the tool or task it was planted in. The probes are those the verifiers
stage runs: `check_environment` and the answer variants of every task (`answer_variant_failures`,
which find an over-strict answer check); `check_environment` includes verifier mutation testing
(quality/verifier_mutations.py, which finds the verifier fault classes). Time: all probes of a world
(`check_environment`), the deep tool probes alone, the verifier mutations alone, and as the baseline the one-call-per-tool probe
(`probe_tools`) of the same world in the same run. The last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table

from worldsmith.agent.adversarial import answer_variant_failures
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.interop.awm import import_scenario, read_release
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.llm.procedural.faults import FAULTS, plant
from worldsmith.quality.deep_probes import deep_probes
from worldsmith.quality.probes import check_environment, probe_tools
from worldsmith.quality.verifier_mutations import verifier_mutations
from worldsmith.runtime.episode import Runtime


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="procedural worlds per domain")
    parser.add_argument("--domains", default="all", help="comma-separated domain keys, or all")
    parser.add_argument("--faults", default="all", help="comma-separated fault classes, or all")
    args = parser.parse_args()
    keys = [d.key for d in DOMAINS] if args.domains == "all" else args.domains.split(",")
    faults = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    procedural = [procedural_bundle(key, seed) for key in keys for seed in range(1, args.seeds + 1)]
    started = time.perf_counter()
    clean_rows, timing = [], []
    found: dict[str, list[bool]] = {fault: [] for fault in faults}
    missed: list[str] = []
    with Runtime() as runtime:
        (scenario,) = read_release(ROOT / "tests" / "data" / "awm_format_sample")
        awm = import_scenario(scenario, runtime, "code").bundle
        clean: list[Bundle] = [load_bundle(ROOT / "examples" / "bundles" / "retail_store"), *procedural, awm]
        for bundle in clean:
            runtime.open_episode(bundle).close()  # load it in a worker first: timings are the probes'
            results, total = timed(check_environment, runtime, bundle)
            _, single = timed(probe_tools, runtime, bundle)
            deep, deep_s = timed(deep_probes, runtime, bundle)
            variants, variants_s = timed(answer_variant_failures, runtime, bundle)
            _, mutations_s = timed(verifier_mutations, runtime, bundle)
            failed = [f"{r.probe} {r.target}: {r.detail[:140]}" for r in results if not r.passed]
            failed += [f"answer variant {v.name}: judged {v.verdict}" for v in variants]
            clean_rows.append((bundle.env_id, len(bundle.tools), len(results), failed))
            timing.append(
                {
                    "world": bundle.env_id,
                    "tools": len(bundle.tools),
                    "all_probes_s": round(total, 2),
                    "deep_s": round(deep_s, 2),
                    "answer_variants_s": round(variants_s, 2),
                    "mutations_s": round(mutations_s, 2),
                    "one_call_per_tool_s": round(single, 3),
                    "deep_over_one_call": round(deep_s / single, 1),
                }
            )
        for bundle in procedural:
            for fault in faults:
                planted = plant(bundle, fault)
                results = check_environment(runtime, planted.bundle)
                hit = [r for r in results if not r.passed and r.target in planted.targets]
                hit += [v for v in answer_variant_failures(runtime, planted.bundle) if v.task_id in planted.targets]
                found[fault].append(bool(hit))
                if not hit:
                    missed.append(f"{bundle.env_id}/{fault}")
    wall = time.perf_counter() - started
    console = Console(width=160)
    shares = Table(title=f"Planted faults found ({len(procedural)} procedural worlds, {wall:.0f} s wall in all)")
    for column in ("fault class", "worlds", "found", "share"):
        shares.add_column(column)
    for fault, hits in found.items():
        shares.add_row(fault, str(len(hits)), str(sum(hits)), f"{sum(hits) / len(hits):.0%}")
    console.print(shares)
    false_positive_worlds = [row for row in clean_rows if row[3]]
    probes = sum(row[2] for row in clean_rows)
    failed_probes = sum(len(row[3]) for row in clean_rows)
    console.print(
        f"clean worlds: {len(clean_rows)}, with a failed probe: {len(false_positive_worlds)} "
        f"(false-positive rate {len(false_positive_worlds) / len(clean_rows):.1%}); "
        f"probes {probes}, failed {failed_probes}"
    )
    for env_id, _, _, failed in false_positive_worlds:
        for r in failed[:3]:
            console.print(f"  FP {env_id}: {r}", highlight=False)
    times = Table(title="Probe time per clean world")
    columns = (
        "world",
        "tools",
        "all probes s",
        "deep probes s",
        "answer variants s",
        "mutations s",
        "one call per tool s",
    )
    for column in (*columns, "deep / one call"):
        times.add_column(column)
    for row in timing:
        times.add_row(*(str(v) for v in row.values()))
    console.print(times)
    deep_times = [row["deep_s"] for row in timing]
    summary = {
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "procedural_worlds": len(procedural),
        "share_found": {fault: round(sum(hits) / len(hits), 3) for fault, hits in found.items()},
        "missed": missed,
        "clean_worlds": len(clean_rows),
        "false_positive_worlds": len(false_positive_worlds),
        "false_positive_rate": round(len(false_positive_worlds) / len(clean_rows), 3),
        "deep_s_median": round(statistics.median(deep_times), 2),
        "deep_s_max": max(deep_times),
        "deep_s_max_world": max(timing, key=lambda row: row["deep_s"])["world"],
        "all_probes_s_median": round(statistics.median(row["all_probes_s"] for row in timing), 2),
        "mutations_s_median": round(statistics.median(row["mutations_s"] for row in timing), 2),
        "deep_over_one_call_median": round(statistics.median(row["deep_over_one_call"] for row in timing), 1),
        "most_tools": max(row["tools"] for row in timing),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
