"""Sandbox scratch directories a killed process left in the temp folder are swept at the next start,
those of live processes and those with no owner recorded kept."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import psutil
import pytest

from worldsmith.runtime.scratch import OWNER_FILE, PREFIX, new_scratch, owner_gone, sweep_stale_scratch

pytestmark = pytest.mark.unit


def _scratch(folder: Path, name: str, owner: dict[str, float] | None) -> Path:
    root = folder / f"{PREFIX}{name}"
    (root / "worker-1").mkdir(parents=True)
    (root / "worker-1" / "world.db").write_bytes(b"x")
    if owner is not None:
        (root / OWNER_FILE).write_text(json.dumps(owner))
    return root


def _dead_process() -> dict[str, float]:
    """The owner record of a process that is gone (as one killed with SIGKILL): a pid no process can
    have (the kernel's pid_max is one past the largest)."""
    return {"pid": int(Path("/proc/sys/kernel/pid_max").read_text()), "started": psutil.Process().create_time()}


def test_the_sweep_removes_only_scratch_whose_owner_is_gone(tmp_path: Path):
    me = {"pid": os.getpid(), "started": psutil.Process().create_time()}
    dead = _scratch(tmp_path, "dead", _dead_process())
    reused = _scratch(tmp_path, "reused", {**me, "started": me["started"] - 1000})  # same pid, another process
    alive = _scratch(tmp_path, "alive", me)
    unowned = _scratch(tmp_path, "unowned", None)
    other = tmp_path / "not-a-sandbox"
    other.mkdir()

    assert sorted(sweep_stale_scratch(tmp_path)) == sorted([dead, reused])
    assert not dead.exists() and not reused.exists()
    assert alive.exists() and unowned.exists() and other.exists()
    assert not owner_gone(unowned)


def test_a_new_scratch_records_its_owner_and_sweeps_the_temp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = _scratch(tmp_path, "dead", _dead_process())
    root = new_scratch()
    assert root.parent == tmp_path and root.name.startswith(PREFIX)
    assert json.loads((root / OWNER_FILE).read_text())["pid"] == os.getpid() and not owner_gone(root)
    assert not dead.exists()
