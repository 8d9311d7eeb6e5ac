#!/usr/bin/env bash
# Set up worldsmith on a fresh machine: a virtual environment in .venv with the pinned
# dependencies of requirements.lock and the project itself (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3.11}"
command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.lock
.venv/bin/python -m pip install --quiet --disable-pip-version-check --no-deps -e .
echo "worldsmith is set up in .venv ($(.venv/bin/python --version))"
