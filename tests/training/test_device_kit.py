"""The GPU smoke scripts run on a worker that has only the training stack (a CUDA image plus the
wheels of bench/device_wheels.sh), without the orchestration stack: Prefect, the catalog's SQL
layer, Great Expectations, MCP, boto3. Here they run in their CPU mode on a site without those
packages, so an import that drags them onto the training path fails this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from support.paths import REPO as ROOT
from support.patience import PROCESS_S

pytestmark = pytest.mark.e2e
ABSENT = (
    "prefect",
    "sqlmodel",
    "sqlalchemy",
    "great_expectations",
    "mcp",
    "boto3",
    "botocore",
    "moto",
    "uvicorn",
    "starlette",
)


def worker_python(tmp_path: Path) -> Path:
    """A virtual environment whose site-packages links to this environment's packages, less those
    of ABSENT (modules and metadata), so that to every import and `find_spec` they do not exist."""
    venv = tmp_path / "worker"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True)
    site = Path(
        subprocess.run(
            [venv / "bin/python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for entry in Path(sysconfig.get_paths()["purelib"]).iterdir():
        name = entry.name.lower().replace("-", "_")
        absent = any(name == a or name.startswith((f"{a}.", f"{a}_", f"{a}-")) for a in ABSENT)
        if not absent and not (site / entry.name).exists():
            (site / entry.name).symlink_to(entry)
    return venv / "bin/python"


def run_python(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the worker's Python on this repository (as bench/device_env.sh puts it on the path)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WORLDSMITH_HOME": str(tmp_path / "home")}
    return subprocess.run(
        [worker_python(tmp_path), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=PROCESS_S
    )


def run_smoke(tmp_path: Path, script: str, *args: str) -> dict:
    """Run a bench smoke script in its CPU mode on the worker's site; returns its JSON summary."""
    done = run_python(tmp_path, f"bench/{script}", "--profile", "cpu-test", *args)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "{")
    return json.loads("\n".join(lines[start:]))


def test_the_worker_site_lacks_exactly_the_orchestration_stack(tmp_path):
    done = run_python(
        tmp_path,
        "-c",
        "import importlib.util as u; print([m for m in ('prefect', 'sqlmodel', 'boto3', 'mcp', 'trl', "
        "'transformers', 'pydantic', 'worldsmith') if u.find_spec(m)])",
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['trl', 'transformers', 'pydantic', 'worldsmith']"


def test_grpo_smoke_needs_no_orchestration_stack(tmp_path):
    summary = run_smoke(
        tmp_path, "gpu_train_smoke.py", "--steps", "1", "--group-size", "2", "--hidden", "64", "--warmup-steps", "2"
    )
    assert summary["logged"] == 1 and summary["device"] == "cpu" and summary["bf16"] is False


def test_grpo_smoke_trains_a_local_checkpoint(tmp_path, tiny_model):
    """--model with a checkpoint directory (no tiny model built, no warm-up), full history (the
    windowed one runs above): a step's times, tokens per second and share of weights changed."""
    summary = run_smoke(
        tmp_path,
        "gpu_train_smoke.py",
        *("--model", str(tiny_model), "--history", "full", "--steps", "1", "--group-size", "2"),
        *("--max-turns", "1", "--max-completion-length", "8"),
    )
    assert summary["model"] == str(tiny_model) and summary["history"] == "full" and summary["logged"] == 1
    assert summary["sampled_tokens_per_s"] > 0 and summary["trained_tokens_per_s"] > 0
    assert 0.0 <= summary["weights_changed"] <= 1.0 and summary["peak_gib"] == 0.0


def test_world_model_smoke_needs_no_orchestration_stack(tmp_path):
    summary = run_smoke(tmp_path, "gpu_world_model_smoke.py", "--steps", "2", "--max-new-tokens", "16")
    assert summary["profile"] == "cpu-test" and summary["simulated_episode"] in {"complete", "incomplete", "env_error"}


def test_device_wheels_asks_for_the_lock_versions_for_the_machine(tmp_path):
    """bench/device_wheels.sh with pip replaced by a recorder: one download of exactly the lock's
    pins, binary only, for the machine's Python and platform."""
    recorder = tmp_path / "pip.py"
    recorder.write_text("import json, pathlib, sys\npathlib.Path(sys.argv[1]).write_text(json.dumps(sys.argv[2:]))\n")
    calls = tmp_path / "args.json"
    env = {**os.environ, "PIP": f"{sys.executable} {recorder} {calls}", "PYVER": "3.12"}
    done = subprocess.run(
        ["bash", "bench/device_wheels.sh", str(tmp_path / "wheels")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    args = json.loads(calls.read_text())
    assert args[0] == "download" and {"--no-deps", "--only-binary=:all:"} <= set(args)
    assert args[args.index("--python-version") + 1] == "3.12" and "manylinux_2_17_x86_64" in args
    pins = {
        line.split("==")[0].lower(): line.strip()
        for line in (ROOT / "requirements.lock").read_text().splitlines()
        if "==" in line
    }
    specs = [a for a in args if "==" in a]
    assert {pins["trl"], pins["transformers"], pins["pydantic"]} <= set(specs) and all(
        pins[s.split("==")[0].lower()] == s for s in specs
    )
    assert not any(
        s.split("==")[0] in {"torch", "numpy", "pyarrow", "prefect"} for s in specs
    )  # the image's, or not needed
