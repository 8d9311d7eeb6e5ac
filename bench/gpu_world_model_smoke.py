"""GPU smoke test of world models: transitions of two procedural worlds, a few SFT steps of the tiny
model (bf16 with gradient checkpointing on CUDA), its one-step and k-step scores, and a simulated
episode answered by it. Run by bench/gpu_train_smoke.sh on a GPU worker; with `--profile cpu-test`
it runs here too (the same code path, fp32 on the CPU).

    python bench/gpu_world_model_smoke.py --profile gpu --steps 20

Prints the SFT step times and peak GPU memory, the scores, and a JSON summary whose ratio is the
median logged interval against the first (warm-up included), so machines compare without
absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["gpu", "cpu-test"], default="gpu")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    os.environ.setdefault("WORLDSMITH_HOME", tempfile.mkdtemp(prefix="worldsmith-wm-smoke-"))

    import torch
    from step_clock import StepClock  # bench/ is the script's directory; imported once the environment above is set

    from worldsmith.agent.loop import run_episode
    from worldsmith.agent.policies import RandomPolicy, ReferencePolicy
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.config import WorldModelConfig
    from worldsmith.training.world_model_sft import fine_tune, tiny_world_model
    from worldsmith.worldmodel.config import SimulationConfig
    from worldsmith.worldmodel.evaluation import evaluate_world_model
    from worldsmith.worldmodel.simulated import SimulatedRuntime
    from worldsmith.worldmodel.transitions import build_transitions
    from worldsmith.worldmodel.world_models import HFWorldModel

    cuda = torch.cuda.is_available()
    if args.profile == "gpu" and not cuda:
        raise SystemExit("profile 'gpu' needs a CUDA device; use --profile cpu-test on this machine")

    bundles = [procedural_bundle("retail", 0), procedural_bundle("clinic", 0)]
    with Runtime() as runtime, tempfile.TemporaryDirectory() as scratch:
        trajectories = [run_episode(runtime, b, t, ReferencePolicy()) for b in bundles for t in b.tasks]
        trajectories += [run_episode(runtime, b, t, RandomPolicy()) for b in bundles for t in b.tasks[:4]]
        transitions = build_transitions(runtime, {b.key: b for b in bundles}, trajectories, validation=0.0, test=0.0)
        clock = StepClock("sft step", ("loss",))
        out = Path(scratch) / "wm"
        fine_tune(
            tiny_world_model(Path(scratch) / "tiny", transitions),
            transitions,
            out,
            WorldModelConfig(profile=args.profile, steps=args.steps),
            [clock],
        )
        model = HFWorldModel(out, max_new_tokens=args.max_new_tokens)
        report = evaluate_world_model(model, transitions[:24], k=2)
        simulation = SimulatedRuntime(
            runtime, SimulationConfig(world_model=f"hf:{out}", samples=2, max_new_tokens=args.max_new_tokens)
        )
        started = time.perf_counter()
        episode = run_episode(runtime, bundles[0], bundles[0].tasks[0], ReferencePolicy(), world=simulation)
        episode_s = time.perf_counter() - started
    one = report.one_step
    print(
        f"one step on {one.transitions} train transitions: observation exact {one.observation_exact:.3f}, "
        f"invalid {one.invalid_rate:.3f}; simulated episode: {episode.verdict} after {len(episode.steps)} call(s), {episode_s:.2f} s"
    )
    print(
        json.dumps(
            {
                "profile": args.profile,
                "device": torch.cuda.get_device_name() if cuda else "cpu",
                "model_device": str(model.model.device),
                "model_dtype": str(model.model.dtype),
                "transitions": len(transitions),
                **clock.summary(),
                "loss": [r["loss"] for r in clock.rows],
                "one_step": one.model_dump(mode="json", exclude={"per_env"}),
                "simulated_episode": episode.verdict,
                "simulation": simulation.stats.as_dict(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
