"""GPU smoke test of GRPO training: the tiny offline Qwen3 model, a few GRPO steps in procedural
worlds, step times and memory printed. Run by bench/gpu_train_smoke.sh on a GPU worker; with
`--profile cpu-test` it runs here too (the same code path, fp32 on the CPU).

    python bench/gpu_train_smoke.py --profile gpu --steps 4 --group-size 8 [--history full]

Prints one line per step (seconds, reward, rows, peak GPU memory) and a JSON summary; the ratio
it reports is the median step time against the first step (compile and warm-up included), so
runs on different machines can be compared without absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["gpu", "cpu-test"], default="gpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--history", choices=["windowed", "full"], default="windowed")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny model")
    parser.add_argument("--warmup-steps", type=int, default=30)
    args = parser.parse_args()

    import torch
    from step_clock import StepClock  # bench/ is the script's directory; imported once the environment above is set
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.config import TrainingConfig
    from worldsmith.training.memory import check_cuda
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, model_dtype, task_dataset
    from worldsmith.training.warmup import reference_rows, warm_up

    check_cuda(args.profile)  # before building anything
    cuda = torch.cuda.is_available()
    bundles = {f"retail_{s}": procedural_bundle("retail", s) for s in (0, 1)}
    runtime = Runtime()

    with tempfile.TemporaryDirectory() as scratch:
        base = build_tiny_model(
            Path(scratch) / "tiny", bundles.values(), hidden_size=args.hidden, layers=4, heads=4, kv_heads=2
        )
        model_dir = warm_up(
            base, reference_rows(runtime, list(bundles.values()), 3), Path(scratch) / "warm", steps=args.warmup_steps
        )
        config = TrainingConfig(
            model=str(model_dir),
            set_name="smoke",
            profile=args.profile,
            group_size=args.group_size,
            steps=args.steps,
            max_turns=6,
            max_completion_length=96,
            learning_rate=1e-5,
            history=args.history,
        )
        clock = StepClock(
            "step", ("reward", "rows", "loss", "sampling/importance_sampling_ratio/mean")
        )  # the last with vLLM only
        trainer = WorldGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(config)),
            args=grpo_args(config, Path(scratch) / "out"),
            train_dataset=task_dataset(bundles),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[clock],
            config=config,
            runtime=runtime,
            bundles=bundles,
        )
        trainer.train()
    runtime.close()
    summary = {
        "profile": args.profile,
        "history": args.history,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        **clock.summary(),
        "use_vllm": trainer.use_vllm,
        "bf16": trainer.args.bf16,
    }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
