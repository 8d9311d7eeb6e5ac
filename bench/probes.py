"""Execution probes against planted faults: the share found per fault class, the false positives on
clean worlds, and the probes' time per world.

    .venv/bin/python bench/probes.py [--seeds 1] [--domains all] [--faults all] [--clean-domains all]

Clean worlds: the golden bundle, procedural worlds (every `--clean-domains` domain, `--seeds` each), the
AWM-format sample imported and the two real-model worlds (examples/realmodel). Each must pass every probe
(a failed probe on a clean world is a false positive). Planted: each procedural world of `--domains` once
per fault class of worldsmith/llm/procedural/faults.py (a world without the artifact a class is planted in
is not counted for it), and the real-model worlds' planted copies (tests/support/realmodel_faults.py); a
fault is found when a failed probe names the tool or task it was planted in. Added validation time: each
clean world is validated twice in the same run, with issue 33's second round of probes switched off (the
unit and format checks of writes, dependent rows by the world's own pattern, the free-text mutations, the
memoised WorldValues: `families_off`) and on; the ratio on/off is the added time. The probes are those the
verifiers stage runs: `check_environment` and the answer variants of every task (`answer_variant_failures`,
which find an over-strict answer check); `check_environment` includes verifier mutation testing
(quality/verifier_mutations.py, which finds the verifier fault classes). Time: all probes of a world
(`check_environment`) with and without the second round, and the answer variants. The last line is a
JSON object.
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
sys.path.insert(0, str(ROOT / "tests"))

from collections.abc import Iterator
from contextlib import contextmanager
from unittest import mock

from rich.console import Console
from rich.table import Table
from support.realmodel import real_world
from support.realmodel_faults import REAL_FAULTS

from worldsmith.agent.adversarial import answer_variant_failures
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import load_bundle
from worldsmith.interop.awm import import_scenario, read_release
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.llm.procedural.faults import FAULTS, plant
from worldsmith.quality import world_values
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime


def timed(function, *args):
    started = time.perf_counter()
    result = function(*args)
    return result, time.perf_counter() - started


@contextmanager
def families_off() -> Iterator[None]:
    """Validation as before issue 33's second round: no unit/format judgement of writes, no dependent rows by
    the world's pattern, no free-text mutations, WorldValues built by each probe family."""
    patches = [
        mock.patch("worldsmith.quality.behaviour_probes.dependent_pattern_probes", lambda *a, **k: []),
        mock.patch("worldsmith.quality.write_effects.unit_or_format_changed", lambda *a, **k: None),
        mock.patch("worldsmith.quality.verifier_mutations._free_text", lambda *a, **k: []),
    ]
    for module in ("deep_probes", "input_probes", "tool_replays", "behaviour_probes"):
        patches.append(mock.patch(f"worldsmith.quality.{module}.world_values", world_values.WorldValues))
    for patch in patches:
        patch.start()
    try:
        yield
    finally:
        for patch in patches:
            patch.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=1, help="procedural worlds per domain")
    parser.add_argument("--domains", default="all", help="comma-separated domain keys, or all")
    parser.add_argument("--faults", default="all", help="comma-separated fault classes, or all")
    parser.add_argument("--clean-domains", default="all", help="domains of the clean worlds, or all")
    args = parser.parse_args()
    keys = [d.key for d in DOMAINS] if args.domains == "all" else args.domains.split(",")
    clean_keys = [d.key for d in DOMAINS] if args.clean_domains == "all" else args.clean_domains.split(",")
    faults = list(FAULTS) if args.faults == "all" else args.faults.split(",")
    procedural = [procedural_bundle(key, seed) for key in keys for seed in range(1, args.seeds + 1)]
    clean_procedural = [procedural_bundle(key, seed) for key in clean_keys for seed in range(1, args.seeds + 1)]
    started = time.perf_counter()
    clean_rows, timing = [], []
    found: dict[str, list[bool]] = {fault: [] for fault in faults}
    real_found: dict[str, list[bool]] = {fault: [] for fault in faults}
    missed: list[str] = []
    with Runtime() as runtime:
        (scenario,) = read_release(ROOT / "tests" / "data" / "awm_format_sample")
        awm = import_scenario(scenario, runtime, "code").bundle
        golden = load_bundle(ROOT / "examples" / "bundles" / "retail_store")
        clean: list[Bundle] = [golden, *clean_procedural, awm, real_world("zocdoc"), real_world("rover")]
        for bundle in clean:
            runtime.open_episode(bundle).close()  # load it in a worker first: timings are the probes'
            with families_off():
                _, baseline = timed(check_environment, runtime, bundle)
            world_values.forget_world_values()
            results, total = timed(check_environment, runtime, bundle)
            variants, variants_s = timed(answer_variant_failures, runtime, bundle)
            print(f"clean {bundle.env_id}: {baseline:.1f} s off, {total:.1f} s on", file=sys.stderr, flush=True)
            failed = [f"{r.probe} {r.target}: {r.detail[:140]}" for r in results if not r.passed]
            failed += [f"answer variant {v.name}: judged {v.verdict}" for v in variants]
            clean_rows.append((bundle.env_id, len(bundle.tools), len(results), failed))
            timing.append(
                {
                    "world": bundle.env_id,
                    "tools": len(bundle.tools),
                    "baseline_s": round(baseline, 2),
                    "all_probes_s": round(total, 2),
                    "over_baseline": round(total / baseline, 2),
                    "answer_variants_s": round(variants_s, 2),
                }
            )
        for bundle in procedural:
            for fault in faults:
                try:
                    planted = plant(bundle, fault)
                except ValueError:
                    continue  # the world has nothing of the shape this class is planted in
                results = check_environment(runtime, planted.bundle)
                hit = [r for r in results if not r.passed and r.target in planted.targets]
                hit += [v for v in answer_variant_failures(runtime, planted.bundle) if v.task_id in planted.targets]
                found[fault].append(bool(hit))
                if not hit:
                    missed.append(f"{bundle.env_id}/{fault}")
                print(f"planted {bundle.env_id}/{fault}: {bool(hit)}", file=sys.stderr, flush=True)
        for real in REAL_FAULTS:
            if real.fault not in real_found:
                continue
            planted_bundle = real.bundle()
            results = check_environment(runtime, planted_bundle)
            hit = [r for r in results if not r.passed and r.target == real.target]
            hit += [v for v in answer_variant_failures(runtime, planted_bundle) if v.task_id == real.target]
            real_found[real.fault].append(bool(hit))
            if not hit:
                missed.append(f"{real.world}/{real.fault}")
    wall = time.perf_counter() - started
    console = Console(width=160)
    shares = Table(title=f"Planted faults found ({len(procedural)} procedural worlds, {wall:.0f} s wall in all)")
    for column in ("fault class", "procedural worlds", "found", "share", "real-model copies found"):
        shares.add_column(column)
    for fault, hits in found.items():
        share = f"{sum(hits) / len(hits):.0%}" if hits else "n/a"
        real = real_found[fault]
        shares.add_row(fault, str(len(hits)), str(sum(hits)), share, f"{sum(real)}/{len(real)}" if real else "")
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
        "baseline s",
        "all probes s",
        "over baseline",
        "answer variants s",
    )
    for column in columns:
        times.add_column(column)
    for row in timing:
        times.add_row(*(str(v) for v in row.values()))
    console.print(times)
    summary = {
        "cores": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "procedural_worlds": len(procedural),
        "share_found": {fault: round(sum(hits) / len(hits), 3) for fault, hits in found.items() if hits},
        "planted_worlds": {fault: len(hits) for fault, hits in found.items()},
        "real_model_found": {fault: f"{sum(h)}/{len(h)}" for fault, h in real_found.items() if h},
        "over_baseline_median": round(statistics.median(row["over_baseline"] for row in timing), 2),
        "over_baseline_max": max(row["over_baseline"] for row in timing),
        "missed": missed,
        "clean_worlds": len(clean_rows),
        "false_positive_worlds": len(false_positive_worlds),
        "false_positive_rate": round(len(false_positive_worlds) / len(clean_rows), 3),
        "baseline_s_median": round(statistics.median(row["baseline_s"] for row in timing), 2),
        "all_probes_s_median": round(statistics.median(row["all_probes_s"] for row in timing), 2),
        "most_tools": max(row["tools"] for row in timing),
        "wall_s": round(wall, 1),
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
