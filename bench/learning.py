"""The learning benchmark with its controls: the demo's training recipe (DemoOptions' TrainingConfig:
the tiny model, its curriculum and warm-up, GRPO) run from the same warmed-up model with the real
rewards, as a placebo with each step's rewards permuted among its rollouts (the same recipe, the same
number of steps, no information about which rollout did well), and untrained (no update at all,
measured with the sampling seeds of the trained arms' "after": what the warm-up alone gives). Each arm
reports its success rate on the trained tasks and on held-out tasks of the same kind (the same tools,
other records: curriculum.held_out_bundles; the generator makes a sibling of every task), sampled as
in training, before and after. The last lines say plainly whether the real arm beat every control after
training by more than two standard errors of this run's measuring rollouts (`separation`), on the
held-out tasks and on the trained ones: evidence from one run, not a bound on the spread between runs.

    .venv/bin/python bench/learning.py [--set NAME] [--worlds retail:0 retail:1 ...]
        [--arms real placebo untrained] [--steps N] [--warmup-steps N] [--success-samples N]

`--set` trains on a set of WORLDSMITH_HOME (the train split; `worldsmith demo` leaves one named `demo`);
without it, on procedural worlds (`--worlds DOMAIN:SEED ...`) written to a scratch directory. The
tiny model is prepared as the train flow prepares it (cached in WORLDSMITH_HOME/models). Prints a
line per arm, the verdicts and a JSON summary. A short run: `--steps 5 --success-samples 16`.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

WORLDS = ["retail:0", "retail:1", "retail:2", "clinic:0", "clinic:1", "clinic:2"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", default=None, help="a set in WORLDSMITH_HOME (default: procedural worlds)")
    parser.add_argument("--worlds", nargs="+", default=WORLDS, help="procedural worlds, DOMAIN:SEED")
    parser.add_argument(
        "--arms", nargs="+", choices=["real", "placebo", "untrained"], default=["real", "placebo", "untrained"]
    )
    parser.add_argument("--steps", type=int, default=None, help="GRPO steps (default: the demo's)")
    parser.add_argument("--success-samples", type=int, default=None, help="rollouts per task (default: the demo's)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="warm-up steps (default: the demo's)")
    args = parser.parse_args(argv)
    for name in ("steps", "success_samples"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.warmup_steps is not None and args.warmup_steps < 0:
        parser.error("--warmup-steps must be at least 0")
    return args


def permuted_rewards(rewards: Any, seed: int) -> Any:
    """`rewards` (rollouts x reward functions) with its scored rows permuted by a generator seeded with
    `seed`; rows without a reward (NaN: env_error) stay where they are."""
    import torch

    scored = (~torch.isnan(rewards[:, 0])).nonzero().flatten()
    generator = torch.Generator().manual_seed(seed)
    permuted = rewards.clone()
    permuted[scored] = rewards[scored[torch.randperm(len(scored), generator=generator)]]
    return permuted


def placebo_trainer() -> type:
    """WorldGRPOTrainer whose step rewards are permuted among the step's scored rollouts
    (`permuted_rewards`, seeded by the run's seed and the step) before the advantages are computed."""
    from worldsmith.training.trainer import WorldGRPOTrainer

    class PlaceboTrainer(WorldGRPOTrainer):
        def _calculate_rewards(self, *args: Any, **kwargs: Any) -> Any:
            rewards = super()._calculate_rewards(*args, **kwargs)
            return permuted_rewards(rewards, self.config.seed * 100_003 + self.state.global_step)

    return PlaceboTrainer


def bundle_paths(args: argparse.Namespace, config: Any, scratch: Path) -> list[str]:
    """The train split of `--set`, or the procedural `--worlds` written under `scratch`."""
    if args.set:
        from worldsmith.flows.train import plan

        return plan.fn(config)["train"]
    from worldsmith.bundle.loader import write_bundle
    from worldsmith.llm.procedural.backend import procedural_bundle

    paths = []
    for world in args.worlds:
        domain, seed = world.split(":")
        paths.append(str(write_bundle(procedural_bundle(domain, int(seed)), scratch / world.replace(":", "_"))))
    return paths


def run_arm(arm: str, config: Any, model: str, paths: list[str], scratch: Path) -> dict[str, Any]:
    """One arm from the prepared model: success before, GRPO, success after; its summary."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.bundle.loader import load_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.curriculum import curriculum_bundles, held_out_bundles
    from worldsmith.training.success import success_rates
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, model_dtype, task_dataset

    loaded = {path: load_bundle(Path(path)) for path in paths}
    bundles = curriculum_bundles(loaded, config.curriculum)
    held_out = held_out_bundles(loaded, config.curriculum)
    trainer_class = placebo_trainer() if arm == "placebo" else WorldGRPOTrainer
    started = time.monotonic()
    with Runtime() as runtime:
        trainer = trainer_class(
            model=AutoModelForCausalLM.from_pretrained(model, dtype=model_dtype(config)),
            args=grpo_args(config, scratch / arm),
            train_dataset=task_dataset(bundles),
            processing_class=AutoTokenizer.from_pretrained(model),
            config=config,
            runtime=runtime,
            bundles={**held_out, **bundles},
        )
        before, held_before = success_rates(trainer, config.success_samples, list(held_out))
        if arm == "untrained":  # no update: measured with the sampling seeds of the trained arms' "after"
            trainer.state.global_step = config.steps
        else:
            trainer.train()
        after, held_after = success_rates(trainer, config.success_samples, list(held_out))
    rewards = [row["reward"] for row in trainer.state.log_history if "reward" in row]
    summary = {
        "arm": arm,
        "tasks": len(bundles),
        "held_out_tasks": len(held_out),
        "rollouts_per_task": config.success_samples,
        "success_before": before.rate,
        "success_after": after.rate,
        "held_out_before": held_before.rate if held_before else None,
        "held_out_after": held_after.rate if held_after else None,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "seconds": round(time.monotonic() - started, 1),
    }
    held = (
        f"{summary['held_out_before']:.3f} -> {summary['held_out_after']:.3f} on {len(held_out)}"
        if held_before and held_after
        else "none of the same kind"
    )
    print(
        f"{arm}: success on {len(bundles)} trained tasks {before.rate:.3f} -> {after.rate:.3f}, held-out {held} "
        f"({config.success_samples} rollouts per task), step reward {summary['reward_first']} -> "
        f"{summary['reward_last']}, {summary['seconds']} s",
        flush=True,
    )
    return summary


def separation(arms: list[dict[str, Any]], measure: str) -> str:
    """Whether the real arm's `measure` ("success" or "held_out") after training beats every control run
    (the placebo, which it needs, and the untrained arm where it ran) by a clear margin: more than two
    standard errors of the difference of the two rates, each over its arm's rollouts, counted with one
    success and one failure added (Agresti-Caffo), so that rates of 0 or 1 still leave a margin. It covers
    the sampling of this run's measuring rollouts only, not the spread between training runs. Said in one
    line either way."""
    after = {a["arm"]: a for a in arms if a.get(f"{measure}_after") is not None}
    if "real" not in after or "placebo" not in after:
        return f"{measure}: not compared (the real and placebo arms both need it)"
    real = after["real"][f"{measure}_after"]
    n = after["real"]["rollouts_per_task"] * after["real"]["tasks" if measure == "success" else "held_out_tasks"]
    controls = {name: after[name][f"{measure}_after"] for name in ("placebo", "untrained") if name in after}
    name, control = max(controls.items(), key=lambda item: item[1])
    margin = 2 * math.sqrt(_variance(real, n) + _variance(control, n))
    said = (
        f"real {real:.3f} vs {name} {control:.3f} (the strongest control) after training ({n} rollouts each; "
        f"clear margin {margin:.3f})"
    )
    if real - control > margin:
        return f"{measure}: SEPARATED, {said}"
    return f"{measure}: DID NOT SEPARATE, {said}: this run is no evidence that GRPO learned from the reward"


def _variance(rate: float, n: int) -> float:
    """The variance of a rate over `n` rollouts, with one success and one failure added (Agresti-Caffo)."""
    smoothed = (rate * n + 1) / (n + 2)
    return smoothed * (1 - smoothed) / (n + 2)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    from worldsmith.demo import DemoOptions
    from worldsmith.flows.train import prepare_model

    options = DemoOptions(set_name=args.set or "learning", warmup_steps=args.warmup_steps or DemoOptions().warmup_steps)
    config = options.training_config()
    config = config.model_copy(
        update={
            "steps": args.steps or config.steps,
            "success_samples": args.success_samples or config.success_samples,
        }
    )
    with tempfile.TemporaryDirectory() as scratch:
        paths = bundle_paths(args, config, Path(scratch))
        started = time.monotonic()
        model = prepare_model.fn(config, paths)
        print(f"tiny model {Path(model).name} prepared (or cached) in {time.monotonic() - started:.1f} s", flush=True)
        arms = [run_arm(arm, config, model, paths, Path(scratch)) for arm in args.arms]
    verdicts = {measure: separation(arms, measure) for measure in ("held_out", "success")}
    for line in verdicts.values():
        print(line, flush=True)
    print(
        json.dumps(
            {"set": args.set, "worlds": None if args.set else args.worlds, "arms": arms, "verdicts": verdicts},
            indent=2,
        )
    )


if __name__ == "__main__":
    from worldsmith.errors import WorldsmithError

    try:
        main()
    except WorldsmithError as exc:  # an expected failure (a set that is not there): its one line
        raise SystemExit(f"bench/learning.py: {exc}") from None
