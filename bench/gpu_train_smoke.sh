#!/usr/bin/env bash
# GPU smoke test of GRPO training, for a lent GPU worker (see docs/training.md).
# Usage: bench/gpu_train_smoke.sh [extra args for bench/gpu_train_smoke.py]
# Needs a CUDA build of torch and the project's dependencies: scripts/setup.sh on a worker, or a
# CUDA image plus the wheels of bench/device_wheels.sh in .whl (bench/device_env.sh installs them).
# Runs a few GRPO steps in bf16 on CUDA in both history modes, on the tiny offline model (warmed up on
# the GPU) or, with --model PATH|HF_ID (a directory, or an id in the local Hugging Face cache), on a real
# checkpoint, and prints step times, tokens/s, peak GPU memory and the share of weights changed; then
# the same for a world model (SFT, scores, a simulated episode).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/device_env.sh
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || { echo "no NVIDIA GPU visible" >&2; exit 2; }
"$PY" -c "import torch; assert torch.cuda.is_available(), 'torch has no CUDA: install a CUDA build'; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
echo "== GRPO smoke, history windowed and full"
"$PY" bench/gpu_train_smoke.py --profile gpu --history both "$@"
echo "== world-model smoke (SFT in bf16, scores, a simulated episode)"
"$PY" bench/gpu_world_model_smoke.py --profile gpu
