"""One-step and k-step scores of the tiny world model on procedural worlds it never saw, in one run
with its floor and ceiling.

    .venv/bin/python bench/world_model_scores.py [--domains 6] [--seeds 2] [--steps 300] [--k 3]

Worlds: the first `domains` procedural domains x `seeds` seeds. Transitions: every tool call of the
reference solutions of every task and of random episodes (4 turns) of every task, replayed in
fresh episodes; environments split train / test (35% test) by `split_of`, so the test worlds are
unseen. The tiny model (built offline, tokenizer trained on the transitions) is fine-tuned on the
train split for `--steps` steps and scored on the test split, next to `static` (always "ok,
nothing changed": the floor) and `oracle` (the real transition: the ceiling); the tiny model is
also scored one step on a sample of its own train transitions (seen worlds), which separates
underfitting from a generalisation gap. The last line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--domains", type=int, default=6)
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=384)
    parser.add_argument(
        "--train-sample",
        type=int,
        default=120,
        help="train transitions (seen worlds) also scored one step, by the tiny model",
    )
    args = parser.parse_args()
    os.environ.setdefault("WORLDSMITH_HOME", tempfile.mkdtemp(prefix="worldsmith-wm-bench-"))
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    sys.path.insert(0, str(REPO))

    from worldsmith.agent.loop import EpisodeConfig, run_episode
    from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.llm.procedural.blocks import DOMAINS
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.config import WorldModelConfig
    from worldsmith.training.world_model_runs import train_world_model
    from worldsmith.worldmodel.evaluation import evaluate_world_model, one_step
    from worldsmith.worldmodel.transitions import build_transitions
    from worldsmith.worldmodel.world_models import HFWorldModel, OracleWorldModel, StaticWorldModel

    started = time.perf_counter()
    bundles = [procedural_bundle(d.key, seed) for d in DOMAINS[: args.domains] for seed in range(args.seeds)]
    with Runtime() as runtime:
        trajectories = [run_episode(runtime, b, t, ReferencePolicy()) for b in bundles for t in b.tasks]
        trajectories += [
            run_episode(runtime, b, t, RandomPolicy(), EpisodeConfig(max_turns=4, seed=i))
            for b in bundles
            for i, t in enumerate(b.tasks)
        ]
        transitions = build_transitions(
            runtime, {b.key: b for b in bundles}, trajectories, seed=0, validation=0.0, test=0.35
        )
    train = [t for t in transitions if t.split == "train"]
    test = [t for t in transitions if t.split == "test"]
    print(
        f"{len(bundles)} worlds, {len(transitions)} transitions: {len(train)} train "
        f"({len({t.env_id for t in train})} worlds), {len(test)} test ({len({t.env_id for t in test})} unseen worlds)"
    )
    trained = train_world_model(transitions, WorldModelConfig(steps=args.steps))
    losses = [e["loss"] for e in trained.log]
    print(f"tiny world model: {args.steps} SFT steps, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
    models = {
        "static (floor)": StaticWorldModel(),
        "tiny, trained": HFWorldModel(trained.model, max_new_tokens=args.max_new_tokens),
        "oracle (ceiling)": OracleWorldModel(),
    }
    reports = {name: evaluate_world_model(model, test, k=args.k) for name, model in models.items()}
    header = f"{'model':18} {'obs exact':>9} {'outcome':>8} {'invalid':>8} {'rows F1':>8} {'fields F1':>9}  compound error by step"
    print(header)
    for name, report in reports.items():
        one = report.one_step
        steps = " ".join(f"{s.compound_error:.3f}" for s in report.k_step.steps)
        print(
            f"{name:18} {one.observation_exact:9.3f} {one.outcome_agreement:8.3f} {one.invalid_rate:8.3f} "
            f"{one.rows.f1:8.3f} {one.fields.f1:9.3f}  {steps}"
        )
    seen = random.Random(0).sample(train, min(args.train_sample, len(train)))
    on_seen = one_step(models["tiny, trained"], seen)
    print(
        f"tiny, trained, on {len(seen)} train transitions (seen worlds): observation exact {on_seen.observation_exact:.3f}, "
        f"outcome {on_seen.outcome_agreement:.3f}, invalid {on_seen.invalid_rate:.3f}, fields F1 {on_seen.fields.f1:.3f}"
    )
    print(f"seconds: {time.perf_counter() - started:.0f}")
    print(
        json.dumps(
            {
                "worlds": len(bundles),
                "train": len(train),
                "test": len(test),
                "steps": args.steps,
                "loss": [losses[0], losses[-1]],
                "tiny_on_seen": on_seen.model_dump(mode="json", exclude={"per_env"}),
                "reports": {
                    name: {
                        "one_step": r.one_step.model_dump(mode="json", exclude={"per_env"}),
                        "k_step": r.k_step.model_dump(mode="json"),
                    }
                    for name, r in reports.items()
                },
            }
        )
    )


if __name__ == "__main__":
    main()
