"""The trainer-side virtual environments of the thin clients (clients/<name>/), built once and cached.

A thin client installs into a trainer's environment without worldsmith's dependencies (docs/integrations.md),
so its tests run it in a virtual environment of its own: `requirements-nodeps.txt` installed with
`--no-deps` (a library whose heavy optional dependencies the client never imports), then
`requirements.txt`, then the client itself. The environment lives under `~/.cache/worldsmith/client-venvs`
(`$XDG_CACHE_HOME` for `~/.cache`), named by a hash of those files and the Python version, so it is built
again only when they change; pip's own cache makes a rebuild cheap. Builds of one environment by
several test workers take turns on a lock file. `python -m support.client_venvs` (run by .ci/run before
the suite) builds every client's, in parallel, and prints when each was ready.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from support.paths import REPO

CLIENTS = REPO / "clients"
_INPUTS = ("requirements-nodeps.txt", "requirements.txt", "pyproject.toml")


def _root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME")
    return (Path(cache) if cache else Path.home() / ".cache") / "worldsmith" / "client-venvs"


def _key(client: Path) -> str:
    digest = hashlib.sha256(sys.version.encode())
    for name in _INPUTS:
        path = client / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.exists() else b""))
    for source in sorted(client.glob("*/*.py")):  # the package's modules
        digest.update(str(source.relative_to(client)).encode() + b"\0" + source.read_bytes())
    return digest.hexdigest()[:16]


def client_python(name: str) -> Path:
    """The Python of client `name`'s environment (clients/<name>), built first unless cached."""
    client = CLIENTS / name
    venv = _root() / f"{name}-{_key(client)}"
    python = venv / "bin" / "python"
    ready = venv / ".ready"
    if ready.exists():
        return python
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another worker may be building it: wait for it
        if not ready.exists():
            shutil.rmtree(venv, ignore_errors=True)  # a build that was interrupted
            _build(client, venv)
            ready.touch()
    return python


def _build(client: Path, venv: Path) -> None:
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    # --no-compile: no .pyc for every module installed (most of a build's CPU); imports compile what they use
    pip = [
        str(venv / "bin" / "python"),
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--no-compile",
    ]
    nodeps = client / "requirements-nodeps.txt"
    if nodeps.exists():
        subprocess.run([*pip, "--no-deps", "-r", str(nodeps)], check=True)
    subprocess.run([*pip, "-r", str(client / "requirements.txt")], check=True)
    with tempfile.TemporaryDirectory() as scratch:  # the build's files (build/, *.egg-info) not left in clients/
        source = shutil.copytree(client, Path(scratch) / client.name)
        subprocess.run([*pip, "--no-deps", "--no-build-isolation", str(source)], check=True)


def main() -> None:
    """Build every client's environment, at once (pip mostly waits on downloads and unpacking)."""
    started = time.monotonic()

    def build(name: str) -> str:
        python = client_python(name)
        return f"{name}: {python} ({time.monotonic() - started:.1f} s)"

    names = sorted(p.name for p in CLIENTS.iterdir() if (p / "pyproject.toml").exists())
    with ThreadPoolExecutor(len(names)) as pool:
        for line in pool.map(build, names):
            print(line, flush=True)


if __name__ == "__main__":
    main()
