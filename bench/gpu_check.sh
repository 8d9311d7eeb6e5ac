#!/usr/bin/env bash
# The GPU check of a paper-size run in one device window (docs/training.md, "The GPU check"): a
# shape-real Qwen3-4B (--shape 8b: 8B) with random weights; peak memory against the estimate (full
# and LoRA), generation throughput on ~4,000-token prompts, training tokens/s, bf16 drift, one step
# of the real trainer. Every part is time-boxed; the whole check ends within --budget-s (default 540).
# Usage: bash bench/gpu_check.sh [--shape 4b|8b] [--budget-s S] [--only PART ...]
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU visible" >&2; exit 2; }
"$PY" bench/gpu_check.py "$@" | tee "${OUT:-/tmp}/gpu_check.log"
