"""Validation time per world, this checkout against another revision's: the same procedural worlds
(domain, seed) validated by each version's own `check_environment` (all execution probes: what the
verifiers and validate stages and `env check` run), each in a fresh process, the two versions taking
turns world by world so load drifts hit both alike.

    .venv/bin/python bench/validation_time.py --baseline REV [--domains retail,clinic,...] [--rounds 2]

The baseline's source is extracted with `git archive` into a temporary directory and imported from
there (the shared virtualenv's packages serve both). Prints each world's seconds per version and the
ratio this / baseline, then their median; the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from worldsmith.llm.procedural.blocks import DOMAINS

REPO = Path(__file__).resolve().parent.parent

#: Run in the child: build the world, open a runtime, validate once for the sandbox's start, then time one more.
CHILD = """
import json, sys, time
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.quality.probes import check_environment
from worldsmith.runtime.episode import Runtime
bundle = procedural_bundle(sys.argv[1], int(sys.argv[2]))
with Runtime() as runtime:
    runtime.open_episode(bundle).close()
    started = time.perf_counter()
    results = check_environment(runtime, bundle)
    seconds = time.perf_counter() - started
import worldsmith
print(json.dumps({"package": worldsmith.__file__, "seconds": seconds, "probes": len(results), "failed": sum(1 for r in results if not r.passed)}))
"""


def extracted(revision: str, into: Path) -> Path:
    """The package `worldsmith` of `revision`, extracted under `into`."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", revision, "worldsmith"], capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"--baseline {revision}: not a revision of this repository (`git log --oneline` lists them)")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def validated(source: Path, domain: str, seed: int) -> dict[str, float]:
    """One world validated by the package found at `source`, in a fresh process (run there: `-c` puts the
    working directory first on the import path)."""
    env = {**os.environ, "PYTHONPATH": str(source)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, domain, str(seed)],
        env=env,
        cwd=source,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{source} {domain}/{seed}: {done.stderr.strip().splitlines()[-1:]}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(result["package"]).startswith(str(source)):
        raise SystemExit(f"{domain}/{seed}: imported {result['package']}, not the package under {source}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, help="the revision to compare with (e.g. a commit id)")
    parser.add_argument("--domains", default="retail,clinic,banking,library,hr", help="comma-separated domains")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="validations per world and version")
    args = parser.parse_args()
    known = {domain.key for domain in DOMAINS}
    if unknown := [d for d in args.domains.split(",") if d not in known]:
        parser.error(
            f"unknown domain {unknown[0]!r}: --domains takes a comma-separated list of {', '.join(sorted(known))}"
        )
    ratios: list[float] = []
    rows = []
    with tempfile.TemporaryDirectory(prefix="validation-baseline-") as scratch:
        baseline = extracted(args.baseline, Path(scratch))
        for domain in args.domains.split(","):
            old, new = [], []
            for _ in range(args.rounds):
                old.append(validated(baseline, domain, args.seed))
                new.append(validated(REPO, domain, args.seed))
            before = statistics.median(r["seconds"] for r in old)
            after = statistics.median(r["seconds"] for r in new)
            ratios.append(after / before)
            rows.append(
                {
                    "world": f"{domain}/{args.seed}",
                    "baseline_s": round(before, 2),
                    "this_s": round(after, 2),
                    "ratio": round(after / before, 2),
                    "probes": [old[0]["probes"], new[0]["probes"]],
                    "failed": [old[0]["failed"], new[0]["failed"]],
                }
            )
            print(
                f"{domain}/{args.seed}: baseline {before:.2f} s, this {after:.2f} s, x{after / before:.2f}", flush=True
            )
    median = statistics.median(ratios)
    print(f"validation time per world, this / {args.baseline}: median x{median:.2f}, max x{max(ratios):.2f}")
    print(json.dumps({"baseline": args.baseline, "median_ratio": round(median, 2), "worlds": rows}))


if __name__ == "__main__":
    main()
