"""Rollout throughput of training, three ways in one run over the same episodes and weights:

- sequential: one episode after another, one `generate` per turn (`HFPolicy`);
- in-process (before issue 36): `WorldGRPOTrainer.rollouts` with `rollout_engine: in_process`, one
  thread per episode and a batch only when every live episode waits (a per-turn barrier);
- engine (after): `rollout_engine: local`, the project's policy server (training/policy_server.py),
  episodes asynchronous against it (training/async_rollouts.py), its batcher taking whatever
  requests are queued.

    .venv/bin/python bench/rollouts.py [--rollouts 16] [--hidden 64] [--tokens 48] [--max-turns 3] [--warmup-steps 0]

Prints, per path, rollouts per second, episodes in flight (the mean batch the model ran, and the most
at once), the model's idle share (wall time outside generation over wall time) and the ratios. The
model is the tiny offline one with random weights, so episodes are short; the point is the ratios.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def trainer_for(
    model_dir: Path, model: Any, tokenizer: Any, bundle: Any, runtime: Any, out: Path, **config: Any
) -> Any:
    from worldsmith.training.config import TrainingConfig
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, task_dataset

    settings = TrainingConfig(model=str(model_dir), set_name="bench", temperature=1.0, **config)
    return WorldGRPOTrainer(
        model=model,
        args=grpo_args(settings, out),
        train_dataset=task_dataset({"b": bundle}),
        processing_class=tokenizer,
        config=settings,
        runtime=runtime,
        bundles={"b": bundle},
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per turn at most")
    parser.add_argument("--max-turns", type=int, default=3)
    parser.add_argument(
        "--warmup-steps",
        type=int,
        default=0,
        help="supervised steps on the world's reference solutions first: the model then calls tools, so "
        "episodes last different numbers of turns (0: random weights, one-turn episodes)",
    )
    args = parser.parse_args()
    for name in ("rollouts", "hidden", "tokens", "max_turns"):
        if getattr(args, name) < (2 if name == "rollouts" else 1):
            parser.error(f"--{name.replace('_', '-')} must be at least {2 if name == 'rollouts' else 1}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.agent.hf_policy import HFPolicy
    from worldsmith.agent.loop import EpisodeConfig, run_episode
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.async_rollouts import RolloutEvents
    from worldsmith.training.config import TrainingConfig
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.warmup import reference_rows, warm_up

    bundle = procedural_bundle("retail", 0)
    task = bundle.tasks[0]
    runtime = Runtime()
    common = {"group_size": args.rollouts, "max_turns": args.max_turns, "max_completion_length": args.tokens}
    inputs = [{"bundle": "b", "task_id": task.id}] * args.rollouts
    rows: dict[str, tuple[float, int, float, float, int]] = {}  # rollouts/s, turns, idle share, mean batch, most
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_tiny_model(Path(scratch) / "tiny", [bundle], hidden_size=args.hidden)
        if args.warmup_steps:
            reference = reference_rows(runtime, [bundle], TrainingConfig.model_fields["window"].default)
            model_dir = warm_up(model_dir, reference, Path(scratch) / "warm", steps=args.warmup_steps)
        tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)

        before = trainer_for(model_dir, model, tokenizer, bundle, runtime, Path(scratch) / "a", **common)
        batches: list[int] = []
        busy = [0.0]
        generate = before.generate_batch

        def timed(prompts: list[list[int]]) -> Any:
            started = time.perf_counter()
            try:
                return generate(prompts)
            finally:
                busy[0] += time.perf_counter() - started
                batches.append(len(prompts))

        before.generate_batch = timed
        before.rollouts(inputs[:2])  # warm the runtime's worker and the model
        batches.clear()
        busy[0] = 0.0
        started = time.perf_counter()
        done = before.rollouts(inputs)
        wall = time.perf_counter() - started
        rows["in-process"] = (
            args.rollouts / wall,
            sum(t.turns for t in done),
            1 - busy[0] / wall,
            sum(batches) / len(batches),
            max(batches),
        )

        after = trainer_for(
            model_dir, model, tokenizer, bundle, runtime, Path(scratch) / "b", rollout_engine="local", **common
        )
        engine = after.engine
        assert engine is not None and engine.server is not None
        after.rollouts(inputs[:2])
        stats = engine.server.batcher.stats
        busy_before, batches_before, requests_before = stats.busy_s, stats.batches, stats.requests
        events = RolloutEvents()
        started = time.perf_counter()
        jobs = [(bundle, task)] * args.rollouts
        episode = EpisodeConfig(max_turns=args.max_turns, window=after.config.window)
        done = engine.rollouts(runtime, jobs, episode, after.config, events=events)
        wall = time.perf_counter() - started
        rows["engine"] = (
            args.rollouts / wall,
            sum(t.turns for t in done),
            1 - (stats.busy_s - busy_before) / wall,
            (stats.requests - requests_before) / max(1, stats.batches - batches_before),
            events.most_in_flight,
        )
        engine.close()
        print(f"in-process {rows['in-process']}; engine {rows['engine']} (sequential next)", flush=True)

        started = time.perf_counter()
        turns = 0
        for seed in range(args.rollouts):
            torch.manual_seed(seed)
            policy = HFPolicy(
                model=model, tokenizer=tokenizer, max_new_tokens=args.tokens, temperature=1.0, timeout_s=None
            )
            config = EpisodeConfig(max_turns=args.max_turns, window=after.config.window, seed=seed)
            turns += run_episode(runtime, bundle, task, policy, config).turns
        wall = time.perf_counter() - started
        rows["sequential"] = (args.rollouts / wall, turns, 0.0, 1.0, 1)
    runtime.close()
    print(
        f"{args.rollouts} rollouts, tiny model hidden {args.hidden} ({args.warmup_steps} warm-up steps), "
        f"<= {args.tokens} tokens per turn, <= {args.max_turns} turns"
    )
    print(f"{'path':<12} {'rollouts/s':>10} {'turns':>6} {'model idle':>10} {'mean batch':>10} {'in flight':>9}")
    for name, (rate, turns, idle, mean, most) in rows.items():
        print(f"{name:<12} {rate:10.2f} {turns:6d} {idle:10.1%} {mean:10.1f} {most:9d}")
    print(f"ratio engine/in-process (rollouts per second): {rows['engine'][0] / rows['in-process'][0]:.2f}")
    print(f"ratio engine/sequential (rollouts per second): {rows['engine'][0] / rows['sequential'][0]:.2f}")


if __name__ == "__main__":
    main()
