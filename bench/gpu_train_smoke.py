"""GPU smoke test of GRPO training: a few GRPO steps in procedural worlds on the tiny offline Qwen3
model (built and warmed up here, on the GPU when there is one) or on a real checkpoint (`--model`: a
directory, or a Hugging Face id already in the local cache; HF_HUB_OFFLINE, set to 1 unless the
environment says otherwise, is respected), in one or both history modes. Run by
bench/gpu_train_smoke.sh on a GPU worker; with `--profile cpu-test` it runs here too (the same code
path, fp32 on the CPU).

    python bench/gpu_train_smoke.py --profile gpu [--model PATH|HF_ID] [--history windowed|full|both]

Prints one line per step (seconds, reward, rows, peak GPU memory) and a JSON summary per history
mode: step times (the ratio of the median step against the first, compile and warm-up included, so
runs on different machines compare without absolute times), tokens per second (sampled, and trained:
the prompt and completion tokens of the rows through forward and backward), peak GPU memory and the
share of trainable weights the run changed (over a strided sample of every trainable tensor).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY = "tiny"
SAMPLED_PER_TENSOR = 4096


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", choices=["gpu", "cpu-test"], default="gpu")
    parser.add_argument("--model", default=TINY, help="`tiny` (built offline), a model directory or a cached HF id")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--history", choices=["windowed", "full", "both"], default="windowed")
    parser.add_argument("--learning-rate", type=float, default=1e-5)
    parser.add_argument("--max-turns", type=int, default=6)
    parser.add_argument("--max-completion-length", type=int, default=96)
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters instead of every weight")
    parser.add_argument("--hidden", type=int, default=256, help="hidden size of the tiny model")
    parser.add_argument("--warmup-steps", type=int, default=30, help="supervised warm-up steps of the tiny model")
    return parser.parse_args(argv)


def resolve_model(model: str) -> str:
    """`model` when it is a model directory or an id the Hugging Face loaders find (offline: in the
    local cache only); otherwise a one-line refusal (exit 2)."""
    from transformers import AutoConfig

    try:
        AutoConfig.from_pretrained(model)
    except (OSError, ValueError) as exc:
        offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "false", "")
        where = "a model directory nor in the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "loadable"
        raise SystemExit(f"--model {model!r} is neither {where}: {' '.join(str(exc).split())[:300]}") from None
    return model


class Weights:
    """A strided sample of every trainable tensor, to tell afterwards which share of it changed."""

    def __init__(self, model: Any):
        self.sampled = {name: self._sample(p) for name, p in model.named_parameters() if p.requires_grad}

    @staticmethod
    def _sample(parameter: Any) -> Any:
        flat = parameter.detach().reshape(-1)
        stride = max(1, flat.numel() // SAMPLED_PER_TENSOR)
        return flat[::stride][:SAMPLED_PER_TENSOR].float().cpu().clone()

    def changed_share(self, model: Any) -> float:
        now = dict(model.named_parameters())
        changed = sum(int((self._sample(now[n]) != before).sum()) for n, before in self.sampled.items() if n in now)
        return changed / max(1, sum(before.numel() for before in self.sampled.values()))


class Throughput:
    """A trainer callback: per optimizer step, sampled and trained tokens per second."""

    def __init__(self) -> None:
        from transformers import TrainerCallback

        owner = self

        class _Callback(TrainerCallback):
            def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                owner.started = time.perf_counter()

            def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
                owner.step_done()

        self.callback, self.trainer, self.started = _Callback(), None, time.perf_counter()
        self.sampled_per_s: list[float] = []
        self.trained_per_s: list[float] = []

    def step_done(self) -> None:
        seconds = max(time.perf_counter() - self.started, 1e-9)
        sampled = sum(t.tokens_out for t in self.trainer.last_rollouts)
        trained = sum(len(r.prompt_ids) + len(r.completion_ids) for r in self.trainer.last_rows)
        self.sampled_per_s.append(sampled / seconds)
        self.trained_per_s.append(trained / seconds)
        print(f"  {sampled} tokens sampled, {trained} trained in {seconds:.2f} s", flush=True)

    def summary(self) -> dict[str, float | None]:
        def median(values: list[float]) -> float | None:
            return statistics.median(values) if values else None

        return {"sampled_tokens_per_s": median(self.sampled_per_s), "trained_tokens_per_s": median(self.trained_per_s)}


def tiny_model(scratch: Path, bundles: dict[str, Any], runtime: Any, args: argparse.Namespace, gpu: bool) -> str:
    """The tiny offline model for `bundles`, warmed up on their reference solutions (on the GPU when `gpu`)."""
    from worldsmith.training.tiny import build_tiny_model
    from worldsmith.training.warmup import reference_rows, warm_up

    base = build_tiny_model(scratch / "tiny", bundles.values(), hidden_size=args.hidden, layers=4, heads=4, kv_heads=2)
    rows = reference_rows(runtime, list(bundles.values()), 3)
    started = time.perf_counter()
    warm_up(base, rows, scratch / "warm", steps=args.warmup_steps, gpu=gpu)
    print(
        f"warm-up: {args.warmup_steps} steps on the {'GPU' if gpu else 'CPU'} in {time.perf_counter() - started:.1f} s"
    )
    return str(scratch / "warm")


def grpo_smoke(model_dir: str, history: str, bundles: dict[str, Any], runtime: Any, args: argparse.Namespace) -> dict:
    """A few GRPO steps of `model_dir` in `history` mode; its summary."""
    import torch
    from step_clock import StepClock  # bench/ is the script's directory; imported once the environment is set
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from worldsmith.training.config import TrainingConfig
    from worldsmith.training.memory import check_fits, device_memory, model_shape
    from worldsmith.training.trainer import WorldGRPOTrainer, grpo_args, model_dtype, peft_config, task_dataset

    config = TrainingConfig(
        model=model_dir,
        set_name="smoke",
        profile=args.profile,
        group_size=args.group_size,
        steps=args.steps,
        max_turns=args.max_turns,
        max_completion_length=args.max_completion_length,
        learning_rate=args.learning_rate,
        history=history,
        lora={"enabled": args.lora},
    )
    shape = model_shape(model_dir)
    if shape is not None and args.profile == "gpu":
        check_fits(config, shape.params, device_memory(), shape)
    if torch.cuda.is_available():
        torch.cuda.reset_peak_memory_stats()
    clock = StepClock("step", ("reward", "rows", "loss", "sampling/importance_sampling_ratio/mean"))  # last: vLLM
    throughput = Throughput()
    with tempfile.TemporaryDirectory() as out:
        trainer = WorldGRPOTrainer(
            model=AutoModelForCausalLM.from_pretrained(model_dir, dtype=model_dtype(config)),
            args=grpo_args(config, Path(out)),
            train_dataset=task_dataset(bundles),
            processing_class=AutoTokenizer.from_pretrained(model_dir),
            callbacks=[clock, throughput.callback],
            peft_config=peft_config(config),
            config=config,
            runtime=runtime,
            bundles=bundles,
        )
        throughput.trainer = trainer
        weights = Weights(trainer.model)
        trainer.train()
        changed = weights.changed_share(trainer.model)
    print(f"history {history}: {changed:.2%} of the sampled trainable weights changed", flush=True)
    return {
        "history": history,
        **clock.summary(),
        **throughput.summary(),
        "weights_changed": changed,
        "use_vllm": trainer.use_vllm,
        "bf16": trainer.args.bf16,
    }


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from worldsmith.failures import UserFixable
    from worldsmith.llm.procedural.backend import procedural_bundle
    from worldsmith.runtime.episode import Runtime
    from worldsmith.training.memory import check_cuda

    try:
        check_cuda(args.profile)  # before building anything
    except UserFixable as exc:
        raise SystemExit(str(exc)) from None
    cuda = torch.cuda.is_available()
    model = args.model if args.model == TINY else resolve_model(args.model)
    bundles = {f"retail_{s}": procedural_bundle("retail", s) for s in (0, 1)}
    histories = ["windowed", "full"] if args.history == "both" else [args.history]
    runtime = Runtime()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            model_dir = tiny_model(Path(scratch), bundles, runtime, args, cuda) if model == TINY else model
            runs = [grpo_smoke(model_dir, history, bundles, runtime, args) for history in histories]
    finally:
        runtime.close()
    shared = {"profile": args.profile, "model": args.model, "device": torch.cuda.get_device_name() if cuda else "cpu"}
    summary = {**shared, **runs[0]} if len(runs) == 1 else {**shared, "histories": runs}
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
