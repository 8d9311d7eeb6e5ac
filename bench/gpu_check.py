"""The GPU check of a paper-size run, in one device window: a shape-real Qwen3 (4B by default; 8B with
`--shape 8b`) built from its config with random weights (nothing downloaded), and per part:

    memory_full, memory_lora  the peak memory of one training pass and AdamW step (fp32 masters under
                              bf16 autocast, activation checkpointing; LoRA over a bf16 base) next to
                              worldsmith's estimate (training/memory.py `estimate_memory`), and the
                              training tokens per second of that pass
    generation                transformers' generate at several batch sizes on ~4,000-token prompts:
                              prefill seconds and decoded tokens per second
    drift                     |log p(bf16) - log p(fp32)| per token (mean, p99, max), bf16 autocast over
                              fp32 weights (the trainer's loss) and bf16 weights (a bf16 sampler)
    e2e                       one step of the real trainer (WorldGRPOTrainer) on a procedural world, full
                              fine-tuning when the estimate fits the device, else LoRA

Each part has its own budget in seconds: a part whose budget is no longer left is skipped with a line,
loops inside a part stop at its deadline, and a watchdog prints the summary and exits once the whole
budget (`--budget-s`) is spent, so the check always ends inside its window. Prints a line per
measurement and, last, the JSON summary (`PARTS`, each with `status` ok/skipped/failed/over and
`seconds`). `--dry-run` runs every part on the CPU with tiny dimensions (the test of this script).

    bash bench/gpu_check.sh [--shape 4b|8b] [--budget-s 540]       # on a GPU machine (docs/training.md)
    python bench/gpu_check.py --dry-run                             # here, about 20 s
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

GIB = 2**30
#: The published Qwen3 configurations (config.json of Qwen/Qwen3-4B and Qwen/Qwen3-8B); `tiny` for the dry run.
SHAPES: dict[str, dict[str, Any]] = {
    "4b": {
        "hidden_size": 2560,
        "intermediate_size": 9728,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": True,
    },
    "8b": {
        "hidden_size": 4096,
        "intermediate_size": 12288,
        "num_hidden_layers": 36,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
    },
    "tiny": {
        "hidden_size": 64,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 1024,
        "tie_word_embeddings": True,
    },
}
PARTS = ("memory_full", "memory_lora", "generation", "drift", "e2e")
#: Seconds each part may take on a GPU (`--budget-s` bounds them all together).
BUDGETS = {"memory_full": 110, "memory_lora": 70, "generation": 130, "drift": 40, "e2e": 150}
#: Fields every part's summary holds once it ran (`status` and `seconds` are always there).
FIELDS = {
    "memory_full": (
        "measured_peak_gib",
        "estimated_peak_gib",
        "estimated_training_gib",
        "tokens",
        "train_tokens_per_s",
    ),
    "memory_lora": (
        "measured_peak_gib",
        "estimated_peak_gib",
        "estimated_training_gib",
        "tokens",
        "train_tokens_per_s",
    ),
    "generation": ("prompt_tokens", "new_tokens", "batches"),
    "drift": ("tokens", "autocast_mean", "autocast_p99", "autocast_max", "bf16_weights_mean", "bf16_weights_p99"),
    "e2e": ("mode", "logged", "step_s", "sampled_tokens_per_s", "trained_tokens_per_s", "peak_gib", "weights_changed"),
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dry-run", action="store_true", help="every part on the CPU with tiny dimensions")
    parser.add_argument("--shape", choices=["4b", "8b"], default="4b")
    parser.add_argument("--budget-s", type=float, default=540.0, help="the whole check's seconds")
    parser.add_argument("--only", nargs="+", choices=PARTS, default=list(PARTS), help="the parts to run")
    parser.add_argument("--prompt-tokens", type=int, default=4000)
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens decoded per sequence")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 64], help="generation batch sizes")
    parser.add_argument("--drift-tokens", type=int, default=2048)
    return parser.parse_args(argv)


class Clock:
    """The check's deadlines: the whole budget and each part's; `left()` is the whole budget's remainder."""

    def __init__(self, budget_s: float):
        self.start, self.budget_s = time.monotonic(), budget_s
        self.part_deadline = float("inf")

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.start)

    def begin(self, part: str) -> bool:
        """Whether `part` may start (its budget still fits the whole); sets its deadline."""
        budget = BUDGETS[part]
        if budget > self.left():
            return False
        self.part_deadline = time.monotonic() + budget
        return True

    def part_over(self) -> bool:
        return time.monotonic() > self.part_deadline


class Check:
    """The parts run in turn, each summarised under its name in `summary`."""

    def __init__(self, args: argparse.Namespace):
        import torch

        self.args, self.torch = args, torch
        self.cuda = torch.cuda.is_available() and not args.dry_run
        self.device = "cuda" if self.cuda else "cpu"
        self.dims = SHAPES["tiny" if args.dry_run else args.shape]
        self.clock = Clock(args.budget_s)
        self.profile = "gpu" if self.cuda else "cpu-test"
        self.summary: dict[str, Any] = {
            "device": torch.cuda.get_device_name() if self.cuda else "cpu",
            "dry_run": args.dry_run,
            "shape": "tiny" if args.dry_run else args.shape,
            "budget_s": args.budget_s,
            **{part: {"status": "not run", "seconds": 0.0} for part in PARTS},
        }
        self.current: str | None = None

    # -- helpers ---------------------------------------------------------------------------------
    def model(self, dtype: Any, vocab: int | None = None, **special: int | None) -> Any:
        """A Qwen3ForCausalLM of the check's dimensions with random weights, built on the device."""
        from transformers import Qwen3Config, Qwen3ForCausalLM

        dims = {**self.dims, "vocab_size": vocab or self.dims["vocab_size"]}
        config = Qwen3Config(**dims, max_position_embeddings=40960, rope_theta=1_000_000, **special)
        self.torch.manual_seed(0)
        with self.torch.device(self.device):
            built = Qwen3ForCausalLM(config)
        return built.to(dtype)

    def free(self) -> None:
        gc.collect()
        if self.cuda:
            self.torch.cuda.empty_cache()
            self.torch.cuda.reset_peak_memory_stats()

    def peak_gib(self) -> float | None:
        """Peak memory the allocator handed out since the last `free` (None on the CPU)."""
        return self.torch.cuda.max_memory_allocated() / GIB if self.cuda else None

    def training_config(self, lora: bool) -> Any:
        from worldsmith.training.config import TrainingConfig

        return TrainingConfig(model="gpu-check", set_name="gpu-check", profile=self.profile, lora={"enabled": lora})

    # -- parts -----------------------------------------------------------------------------------
    def memory(self, lora: bool) -> dict[str, Any]:
        """One training pass of estimate.pass_tokens tokens (rows of the estimate's row length, the loss on
        each row's completion) and one AdamW step, twice (the second timed); measured against the estimate."""
        from worldsmith.training.memory import ModelShape, device_memory, estimate_memory, row_tokens
        from worldsmith.training.trainer import peft_config

        torch = self.torch
        config = self.training_config(lora)
        estimate = estimate_memory(config, ModelShape.from_config(self.dims), device_memory())  # type: ignore[arg-type]
        row = row_tokens(config)
        if self.args.dry_run:
            row = 64
        rows = max(1, estimate.pass_tokens // row) if not self.args.dry_run else 2
        completion = min(config.max_completion_length, row // 2)
        gpu_bf16 = self.cuda
        model = self.model(torch.bfloat16 if lora and gpu_bf16 else torch.float32)
        if gpu_bf16:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            from peft import get_peft_model

            model.enable_input_require_grads()
            model = get_peft_model(model, peft_config(config))
        trainable = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(trainable, lr=1e-6, fused=True)  # the Trainer's default, adamw_torch_fused
        tokens = torch.randint(0, self.dims["vocab_size"], (rows, row), device=self.device)
        out: dict[str, Any] = {"tokens": rows * row, "rows": rows, "completion_tokens": completion}
        times, logits, logp = [], None, None
        for _ in range(2):
            if self.clock.part_over():
                break
            started = time.perf_counter()
            with torch.autocast(self.device, dtype=torch.bfloat16, enabled=gpu_bf16):
                logits = model(input_ids=tokens, logits_to_keep=completion + 1).logits[:, :-1].float()
            logp = torch.log_softmax(logits, -1).gather(-1, tokens[:, -completion:, None])
            (-logp.mean()).backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if self.cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        del model, optimizer, logits, logp
        states_and_activations = estimate.states + estimate.reference + estimate.activations
        out |= {
            "measured_peak_gib": self.peak_gib(),
            "estimated_peak_gib": estimate.peak / GIB,
            "estimated_training_gib": states_and_activations / GIB,
            "estimate": estimate.describe(),
            "estimate_pass_tokens": estimate.pass_tokens,
            "train_tokens_per_s": rows * row / times[-1] if times else None,
            "passes": len(times),
        }
        measured = "n/a on the CPU" if out["measured_peak_gib"] is None else f"{out['measured_peak_gib']:.1f} GiB"
        print(
            f"{'LoRA' if lora else 'full'}: {rows} x {row} tokens, measured peak {measured}; estimate: training "
            f"{out['estimated_training_gib']:.1f} GiB, run peak {estimate.describe()}; "
            f"{out['train_tokens_per_s'] or 0:.0f} trained tokens/s",
            flush=True,
        )
        return out

    def generation(self) -> dict[str, Any]:
        """Greedy generate of `new_tokens` at each batch size on random prompts of `prompt_tokens`:
        the prefill (one new token) and the decoding rate of the rest, until the part's deadline."""
        torch = self.torch
        prompt, new = (32, 8) if self.args.dry_run else (self.args.prompt_tokens, self.args.new_tokens)
        batches = [1, 2] if self.args.dry_run else self.args.batches
        model = self.model(torch.bfloat16 if self.cuda else torch.float32, eos_token_id=None, pad_token_id=0)
        model.eval()
        results = []
        for batch in batches:
            if self.clock.part_over():
                print(f"generation: batch {batch} skipped, the part's budget is spent", flush=True)
                break
            ids = torch.randint(1, self.dims["vocab_size"], (batch, prompt), device=self.device)
            self.free()
            try:
                prefill = self._generate(model, ids, 1)
                total = self._generate(model, ids, new)
            except torch.cuda.OutOfMemoryError:
                print(f"generation: batch {batch} out of memory", flush=True)
                results.append({"batch": batch, "status": "oom"})
                break
            decode = batch * (new - 1) / max(total - prefill, 1e-9)
            results.append(
                {
                    "batch": batch,
                    "prefill_s": prefill,
                    "total_s": total,
                    "decode_tokens_per_s": decode,
                    "tokens_per_s": batch * new / total,
                    "peak_gib": self.peak_gib(),
                }
            )
            print(
                f"generation: batch {batch} x {prompt} prompt tokens: prefill {prefill:.2f} s, "
                f"{new} new tokens in {total:.2f} s ({decode:.0f} decoded tokens/s)",
                flush=True,
            )
        del model
        return {"prompt_tokens": prompt, "new_tokens": new, "batches": results}

    def _generate(self, model: Any, ids: Any, new: int) -> float:
        started = time.perf_counter()
        with self.torch.no_grad():
            model.generate(
                ids, attention_mask=self.torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new, do_sample=False
            )
        if self.cuda:
            self.torch.cuda.synchronize()
        return time.perf_counter() - started

    def drift(self) -> dict[str, Any]:
        """Log-probabilities of one random sequence's next tokens in fp32, under bf16 autocast over the
        fp32 weights, and with the weights in bf16: |difference| per token against fp32."""
        torch = self.torch
        length = 64 if self.args.dry_run else self.args.drift_tokens
        model = self.model(torch.float32).eval()
        ids = torch.randint(0, self.dims["vocab_size"], (1, length), device=self.device)

        def logprobs(net: Any, autocast: bool) -> Any:
            with torch.no_grad(), torch.autocast(self.device, dtype=torch.bfloat16, enabled=autocast):
                logits = net(input_ids=ids).logits[0, :-1].float()
            return torch.log_softmax(logits, -1).gather(-1, ids[0, 1:, None])[:, 0]

        exact = logprobs(model, False)
        autocast = (logprobs(model, True) - exact).abs()
        model.to(torch.bfloat16)
        weights = (logprobs(model, False) - exact).abs()
        del model
        out = {"tokens": length - 1, "mean_logprob_fp32": float(exact.mean())}
        for name, delta in (("autocast", autocast), ("bf16_weights", weights)):
            out |= {
                f"{name}_mean": float(delta.mean()),
                f"{name}_p99": float(torch.quantile(delta, 0.99)),
                f"{name}_max": float(delta.max()),
            }
        print(
            f"drift over {length - 1} tokens: bf16 autocast mean {out['autocast_mean']:.2e} p99 "
            f"{out['autocast_p99']:.2e}; bf16 weights mean {out['bf16_weights_mean']:.2e} p99 {out['bf16_weights_p99']:.2e}",
            flush=True,
        )
        return out

    def e2e(self) -> dict[str, Any]:
        """One step of the real trainer on a procedural world, with the check's dimensions and a tokenizer
        trained on the world (the model's vocabulary is the tokenizer's): full fine-tuning when the
        estimate fits this device, else LoRA (bench/gpu_train_smoke.py's `grpo_smoke`)."""
        from gpu_train_smoke import grpo_smoke  # bench/ is this script's directory

        from worldsmith.failures import UserFixable
        from worldsmith.llm.procedural.backend import procedural_bundle
        from worldsmith.runtime.episode import Runtime
        from worldsmith.training.tiny import corpus, train_tokenizer

        bundles = {"retail_0": procedural_bundle("retail", 0)}
        steps = argparse.Namespace(
            profile=self.profile,
            group_size=2 if self.args.dry_run else 4,
            steps=1,
            max_turns=1 if self.args.dry_run else 2,
            max_completion_length=8 if self.args.dry_run else 64,
            learning_rate=1e-5,
            lora=False,
        )
        with tempfile.TemporaryDirectory() as scratch, Runtime() as runtime:
            tokenizer = train_tokenizer(corpus(bundles.values()), 1024 if self.args.dry_run else 4096)
            special = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id}
            model = self.model(self.torch.bfloat16 if self.cuda else self.torch.float32, len(tokenizer), **special)
            model.save_pretrained(scratch)
            tokenizer.save_pretrained(scratch)
            del model
            self.free()
            try:
                result = grpo_smoke(scratch, "windowed", bundles, runtime, steps)
            except UserFixable as refused:
                print(f"e2e: full fine-tuning refused ({refused}); LoRA instead", flush=True)
                self.free()
                steps.lora = True
                result = grpo_smoke(scratch, "windowed", bundles, runtime, steps)
        return {
            "mode": "lora" if steps.lora else "full",
            "logged": result["logged"],
            "step_s": result["first_step_s"],
            "sampled_tokens_per_s": result["sampled_tokens_per_s"],
            "trained_tokens_per_s": result["trained_tokens_per_s"],
            "peak_gib": result["peak_gib"] if self.cuda else None,
            "weights_changed": result["weights_changed"],
        }

    # -- running ---------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        parts: dict[str, Callable[[], dict[str, Any]]] = {
            "memory_full": lambda: self.memory(lora=False),
            "memory_lora": lambda: self.memory(lora=True),
            "generation": self.generation,
            "drift": self.drift,
            "e2e": self.e2e,
        }
        for name in PARTS:
            if name not in self.args.only:
                self.summary[name] = {"status": "skipped", "seconds": 0.0, "reason": "not in --only"}
                continue
            if not self.clock.begin(name):
                reason = f"its budget of {BUDGETS[name]} s is more than the {self.clock.left():.0f} s left"
                print(f"{name}: skipped, {reason}", flush=True)
                self.summary[name] = {"status": "skipped", "seconds": 0.0, "reason": reason}
                continue
            self.current, started = name, time.monotonic()
            self.free()
            try:
                self.summary[name] = {"status": "ok", **parts[name]()}
            except self.torch.cuda.OutOfMemoryError as exc:
                print(f"{name}: out of memory ({' '.join(str(exc).split())[:200]})", flush=True)
                self.summary[name] = {"status": "oom", "peak_gib": self.peak_gib()}
            except Exception as exc:  # one part's failure is its result; the others still run
                print(f"{name}: failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}", flush=True)
                self.summary[name] = {"status": "failed", "error": f"{type(exc).__name__}: {exc}"[:500]}
            self.summary[name]["seconds"] = round(time.monotonic() - started, 1)
            self.current = None
            self.free()
        return self.summary


def print_summary(summary: dict[str, Any]) -> None:
    print(json.dumps(summary, indent=2), flush=True)


def watchdog(check: Check) -> threading.Timer:
    """Once the whole budget is spent: mark the part in flight `over`, print the summary, exit 3."""

    def over() -> None:
        if check.current is not None:
            check.summary[check.current] = {"status": "over", "seconds": round(time.monotonic() - check.clock.start, 1)}
            print(f"{check.current}: stopped, the check's budget of {check.args.budget_s:.0f} s is spent", flush=True)
        print_summary(check.summary)
        os._exit(3)

    timer = threading.Timer(check.args.budget_s, over)
    timer.daemon = True
    return timer


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    if not args.dry_run and not torch.cuda.is_available():
        raise SystemExit("the GPU check needs a CUDA device and torch sees none here; --dry-run runs it on the CPU")
    check = Check(args)
    timer = watchdog(check)
    timer.start()
    summary = check.run()
    timer.cancel()
    print_summary(summary)


if __name__ == "__main__":
    main()
