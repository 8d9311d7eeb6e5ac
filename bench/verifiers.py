"""Verifier robustness: adversarial trajectories against the golden bundle and procedural worlds.

    .venv/bin/python bench/verifiers.py [--seeds 3] [--domains all]

For every task: the reference solution (must be complete) and five adversaries (do nothing, claim
success without acting, act on the wrong entity, the task plus a destructive side effect, half the
task); none may be complete, and `half` must be partial where the solution has two or more state
changes. And the verifiers' false negatives hunted: the reference's end state with its final answer
worded otherwise (reworded, extra context, other formatting, lists reordered, excluded items named;
`answer_variant`) must be complete. Each world is judged twice in the same run: with the side-effect
guard (the default verdict path) and with the task verifiers alone (the baseline). Prints false-positive
and false-negative rates (and the answer variants' own false-negative rate) per verdict path and per
probe kind; the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from rich.console import Console
from rich.table import Table

from worldsmith.agent.adversarial import rates, run_probes
from worldsmith.bundle.loader import load_bundle
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.runtime.episode import Runtime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=2, help="procedural worlds per domain")
    parser.add_argument("--domains", default="all", help="comma-separated domain keys, or all")
    args = parser.parse_args()
    keys = [d.key for d in DOMAINS] if args.domains == "all" else args.domains.split(",")
    bundles = {
        "golden": [load_bundle(ROOT / "examples" / "bundles" / "retail_store")],
        "procedural": [procedural_bundle(key, seed) for key in keys for seed in range(1, args.seeds + 1)],
    }
    report: dict[str, dict[str, object]] = {}
    started = time.perf_counter()
    with Runtime() as runtime:
        for guard in (True, False):
            for group, members in bundles.items():
                probes = [p for bundle in members for p in run_probes(runtime, bundle, guard=guard)]
                report[f"{group}{'' if guard else '_verifier_only'}"] = rates(probes)
    kinds = ("nothing", "claim", "wrong_entity", "side_effect", "half", "answer_variant")
    table = Table(
        title=f"Adversarial verdicts ({sum(len(b) for b in bundles.values())} worlds, {time.perf_counter() - started:.1f} s): "
        "judged complete / probes"
    )
    for column in ("verdict path", "probes", "FP rate", "FN rate", "variant FN rate", *kinds):
        table.add_column(column)
    for name, r in report.items():
        by_kind = r["by_kind"]

        def cell(kind):
            return f"{by_kind.get(kind, {}).get('verdicts', {}).get('complete', 0)}/{by_kind.get(kind, {}).get('n', 0)}"

        table.add_row(
            name,
            str(r["probes"]),
            f"{r['false_positive_rate']:.3f}",
            f"{r['false_negative_rate']:.3f}",
            f"{r['answer_variant_false_negative_rate']:.3f}",
            *(cell(k) for k in kinds),
        )
    Console(width=160).print(table)
    for name, r in report.items():
        for line in r["false_positives"][:5] + r["false_negatives"][:5]:
            print(f"  {name}: {line}")
    summary = {
        name: {
            k: r[k]
            for k in ("probes", "false_positive_rate", "false_negative_rate", "answer_variant_false_negative_rate")
        }
        for name, r in report.items()
    }
    summary["worlds"] = {group: len(members) for group, members in bundles.items()}
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
