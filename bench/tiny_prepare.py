"""The tiny model's preparation for `worldsmith demo` (the train flow's prepare-model step: tokenizer
and weights built offline, reference and lazy-habit rows replayed, supervised warm-up), on a set
already in WORLDSMITH_HOME (`worldsmith demo` leaves one named `demo`), with the demo's curriculum.

    WORLDSMITH_HOME=... OMP_WAIT_POLICY=PASSIVE .venv/bin/python bench/tiny_prepare.py [--set demo] [--warmup-steps 80]

Prints wall seconds and CPU seconds of this process and its children (the sandbox workers). On a
shared machine the wall time measures the load; the CPU time bounds what 2 idle cores take (with
OpenMP's spin-waiting off, as above, waiting threads do not count as work). A model this run
builds is removed afterwards; one already cached is left alone and nothing is measured.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default="demo")
    parser.add_argument("--warmup-steps", type=int, default=80)
    args = parser.parse_args()

    from worldsmith.demo import DemoOptions
    from worldsmith.flows.train import plan, prepare_model
    from worldsmith.settings import get_settings

    config = DemoOptions(set_name=args.set, warmup_steps=args.warmup_steps).training_config()
    paths = plan.fn(config)["train"]
    models = get_settings().home / "models"
    cached = set(models.iterdir()) if models.is_dir() else set()
    started = time.monotonic()
    model = Path(prepare_model.fn(config, paths))
    wall = time.monotonic() - started
    if model in cached:
        raise SystemExit(f"{model} was cached already: nothing measured (remove it to measure)")
    cpu = sum(
        r.ru_utime + r.ru_stime for r in map(resource.getrusage, (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    )
    print(
        f"prepared {model.name}: wall {wall:.1f} s, cpu {cpu:.1f} s (this process and its children, imports included)"
    )
    shutil.rmtree(model)


if __name__ == "__main__":
    main()
