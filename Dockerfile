# syntax=docker/dockerfile:1
# The worker image of the gpu pool (docs/operations.md, "The gpu pool on Docker or Kubernetes"):
# worldsmith and its pinned dependencies, torch from a CUDA index.
#
#   docker build -t worldsmith-worker:latest .
#   docker build --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu -t worldsmith-worker:cpu .
#
# torch: requirements.lock pins the CPU build (torch==2.13.0+cpu, what CI and scripts/setup.sh
# install); this image installs torch 2.13.0 from TORCH_INDEX instead (default: a CUDA 12.8 build,
# which brings its CUDA libraries as wheels, so the base needs no CUDA, only the host's NVIDIA
# driver through the NVIDIA container toolkit) and every other pin of the lock as it is. For a
# CPU-only image (tests, the local pool) pass the CPU index above: about 2 GB smaller.
#
# Started by a Docker or Kubernetes worker, a container runs one flow run (the worker's command);
# started by hand it is a process worker on the gpu pool:
#   docker run --gpus all -e PREFECT_API_URL=http://prefect.internal:4200/api worldsmith-worker:latest
FROM python:3.11-slim-bookworm

ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    GX_ANALYTICS_ENABLED=false

WORKDIR /opt/worldsmith

# dependencies first (a layer that changes only with the lock)
COPY requirements.lock ./
RUN grep -v '^torch==' requirements.lock > /tmp/requirements.txt \
    && pip install --index-url "$TORCH_INDEX" torch==2.13.0 \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# the project (worldsmith/deployments links to deployments/: both are copied)
COPY pyproject.toml README.md ./
COPY deployments ./deployments
COPY worldsmith ./worldsmith
RUN pip install --no-deps . && worldsmith --version

CMD ["prefect", "worker", "start", "--pool", "gpu", "--type", "process", "--limit", "1"]
