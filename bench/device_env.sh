# Sourced by the GPU smoke scripts: picks the Python (PYTHON, else .venv's, else python3), puts the
# repository on its path, and installs the wheels of bench/device_wheels.sh into a scratch site
# when WHEELS (default .whl) holds any, ahead of the machine's own packages.
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
WHEELS=${WHEELS:-.whl}
if compgen -G "$WHEELS/*.whl" >/dev/null; then
  SITE=${DEVICE_SITE:-/tmp/worldsmith-site}
  "$PY" -m pip install --quiet --disable-pip-version-check --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl
  export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
  echo "installed $(ls "$WHEELS"/*.whl | wc -l) wheels from $WHEELS into $SITE"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRL_EXPERIMENTAL_SILENCE=1 PREFECT_SERVER_ANALYTICS_ENABLED=false GX_ANALYTICS_ENABLED=false
