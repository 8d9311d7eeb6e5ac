"""A runtime's own scratch directory in the system temp folder, and the sweep of those a killed process
left behind.

`new_scratch()` makes `worldsmith-sandbox-*` and records its owner in it (`OWNER_FILE`: pid and start
time, as a pid is reused and the pair is not); the runtime removes it when it closes. A process killed
with SIGKILL (or out of memory) cannot: `sweep_stale_scratch()`, run by each new runtime before it
makes its own, removes those whose owner is gone. One without an owner record (made before owners
were recorded, or while one is being made) is left alone.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import psutil

#: How a runtime's scratch directory in the temp folder is named.
PREFIX = "worldsmith-sandbox-"
#: The file in a scratch directory naming the process that owns it: {"pid": ..., "started": ...}.
OWNER_FILE = "owner.json"


def new_scratch() -> Path:
    """A fresh scratch directory in the temp folder, owned (per its `OWNER_FILE`) by this process;
    stale ones of processes gone are swept first."""
    sweep_stale_scratch()
    root = Path(tempfile.mkdtemp(prefix=PREFIX))
    owner = {"pid": os.getpid(), "started": psutil.Process().create_time()}
    (root / OWNER_FILE).write_text(json.dumps(owner))
    return root


def owner_gone(root: Path) -> bool:
    """Whether the process recorded as `root`'s owner no longer runs (False when none is recorded)."""
    try:
        owner = json.loads((root / OWNER_FILE).read_text())
        pid, started = int(owner["pid"]), float(owner["started"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # no record (yet): not ours to judge
    try:
        return bool(psutil.Process(pid).create_time() != started)
    except psutil.NoSuchProcess:
        return True


def sweep_stale_scratch(folder: Path | None = None) -> list[Path]:
    """Remove the runtimes' scratch directories in `folder` (default: the temp folder) whose owner is
    gone; returns those removed."""
    swept = []
    for root in Path(folder or tempfile.gettempdir()).glob(PREFIX + "*"):
        if root.is_dir() and owner_gone(root):
            shutil.rmtree(root, ignore_errors=True)
            swept.append(root)
    return swept
