"""A trainer callback for the GPU smoke scripts: per logged step, the seconds since the last one,
the peak GPU memory and chosen log values, printed and kept; `summary` turns them into the
ratio the scripts report (median interval against the first, warm-up included)."""

from __future__ import annotations

import statistics
import time
from typing import Any

import torch
from transformers import TrainerCallback


class StepClock(TrainerCallback):
    def __init__(self, label: str, keys: tuple[str, ...]):
        self.label, self.keys = label, keys
        self.rows: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if not logs or "loss" not in logs:
            return
        now = time.perf_counter()
        memory = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else 0.0
        self.rows.append(
            {
                "step": state.global_step,
                "seconds": now - self.started,
                "peak_gib": memory,
                **{k: logs.get(k) for k in self.keys},
            }
        )
        shown = ", ".join(f"{k} {logs[k]:.3f}" for k in self.keys if isinstance(logs.get(k), (int, float)))
        print(
            f"{self.label} {state.global_step}: {now - self.started:.2f} s, {shown}, peak GPU memory {memory:.2f} GiB",
            flush=True,
        )
        self.started = now

    def summary(self) -> dict[str, Any]:
        times = [r["seconds"] for r in self.rows]
        return {
            "logged": len(times),
            "first_step_s": times[0] if times else None,
            "median_step_s": statistics.median(times) if times else None,
            "median_vs_first": statistics.median(times) / times[0] if times else None,
            "peak_gib": max((r["peak_gib"] for r in self.rows), default=0.0),
        }
