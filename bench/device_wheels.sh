#!/usr/bin/env bash
# Wheels for a GPU machine that has no package index but a CUDA image of its own (torch, numpy,
# pandas, pyarrow, an older Hugging Face stack): downloads, at requirements.lock's versions, what
# bench/gpu_train_smoke.sh imports beyond such an image, for the machine's Python and platform.
# bench/gpu_train_smoke.sh installs them from DEST into a scratch site when DEST holds any.
#
# Usage: bench/device_wheels.sh [DEST]          (DEST defaults to .whl, which git ignores)
#        PYVER=3.12 PLATFORM=x86_64 bench/device_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=${1:-.whl}
PYVER=${PYVER:-3.12}
ARCH=${PLATFORM:-x86_64}
PIP=${PIP:-python3 -m pip}

# The Hugging Face stack at the lock's versions (an image's own may be older than the code needs),
# TRL and datasets, pydantic (settings, configs), the OpenAI client and Faker (imported by the
# world-model and procedural-world modules), with their dependencies that such an image lacks.
PACKAGES=(
  transformers tokenizers huggingface-hub hf-xet safetensors accelerate peft trl
  datasets dill multiprocess
  httpx2 httpcore2 truststore
  pydantic pydantic-core pydantic-settings typing-inspection annotated-types python-dotenv
  openai jiter sniffio
  faker jsonschema jsonschema-specifications referencing rpds-py
)

specs=()
for name in "${PACKAGES[@]}"; do
  line=$(grep -i -m1 "^${name}==" requirements.lock) || { echo "device_wheels: $name is not in requirements.lock" >&2; exit 2; }
  specs+=("$line")
done

platforms=()
for n in 17 24 27 28 31 34 35 39; do platforms+=(--platform "manylinux_2_${n}_${ARCH}"); done
platforms+=(--platform "manylinux2014_${ARCH}" --platform "manylinux1_${ARCH}")

mkdir -p "$DEST"
$PIP download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
  --python-version "$PYVER" --implementation cp "${platforms[@]}" -d "$DEST" "${specs[@]}"
echo "device_wheels: $(ls "$DEST"/*.whl | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST (Python $PYVER, $ARCH)"
