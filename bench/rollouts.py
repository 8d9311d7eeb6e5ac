"""Rollout throughput of training: episodes run concurrently with generation batched across them
(`WorldGRPOTrainer.rollouts`: the Batcher and TRL's generation backend) against the baseline of
the same episodes one after another, one `generate` call per turn (`HFPolicy`), in one run.

    .venv/bin/python bench/rollouts.py [--rollouts 16] [--hidden 64]

Prints rollouts per second of both and the ratio (batched / sequential). The model is the tiny
offline one with random weights, so episodes are short; the point is the ratio.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=16)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=48, help="tokens generated per turn at most")
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.agent.hf_policy import HFPolicy
    from worldsmith.agent.loop import EpisodeConfig, run_episode
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.config import TrainingConfig
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, task_dataset

    bundle = procedural_bundle("retail", 0)
    task = bundle.tasks[0]
    runtime = Runtime()
    with tempfile.TemporaryDirectory() as scratch:
        model_dir = build_tiny_model(Path(scratch) / "tiny", [bundle], hidden_size=args.hidden)
        tokenizer, model = AutoTokenizer.from_pretrained(model_dir), AutoModelForCausalLM.from_pretrained(model_dir)
        config = TrainingConfig(
            model=str(model_dir),
            set_name="bench",
            group_size=args.rollouts,
            max_turns=3,
            max_completion_length=args.tokens,
            temperature=1.0,
        )
        trainer = WorldGRPOTrainer(
            model=model,
            args=grpo_args(config, Path(scratch) / "out"),
            train_dataset=task_dataset({"b": bundle}),
            processing_class=tokenizer,
            config=config,
            runtime=runtime,
            bundles={"b": bundle},
        )
        inputs = [{"bundle": "b", "task_id": task.id}] * args.rollouts
        trainer.rollouts(inputs[:2])  # warm the runtime's worker and the model
        started = time.perf_counter()
        batched = trainer.rollouts(inputs)
        batched_s = time.perf_counter() - started

        started = time.perf_counter()
        sequential = []
        for seed in range(args.rollouts):
            torch.manual_seed(seed)
            policy = HFPolicy(
                model=model, tokenizer=tokenizer, max_new_tokens=args.tokens, temperature=1.0, timeout_s=None
            )
            sequential.append(
                run_episode(runtime, bundle, task, policy, EpisodeConfig(max_turns=3, window=3, seed=seed))
            )
        sequential_s = time.perf_counter() - started
    runtime.close()
    turns_b, turns_s = sum(t.turns for t in batched), sum(t.turns for t in sequential)
    print(f"{args.rollouts} rollouts, tiny model hidden {args.hidden}, <= {args.tokens} tokens per turn")
    print(f"batched:    {args.rollouts / batched_s:8.2f} rollouts/s ({turns_b} turns)")
    print(f"sequential: {args.rollouts / sequential_s:8.2f} rollouts/s ({turns_s} turns)")
    print(f"ratio batched/sequential (rollouts per second): {sequential_s / batched_s:.2f}")


if __name__ == "__main__":
    main()
