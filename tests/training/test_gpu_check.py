"""bench/gpu_check.py, the GPU check of a paper-size run: its dry run exercises every part on the CPU
with tiny dimensions and reports every field the GPU run reports; its clock skips a part whose budget
no longer fits the whole check."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest
from support.paths import REPO
from support.patience import PROCESS_S


def gpu_check_module():
    spec = importlib.util.spec_from_file_location("gpu_check", REPO / "bench/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.sandbox
def test_gpu_check_dry_run_reports_every_part_and_field(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "WORLDSMITH_HOME": str(tmp_path / "home")}
    done = subprocess.run(
        [sys.executable, "bench/gpu_check.py", "--dry-run"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=PROCESS_S,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    summary = json.loads("\n".join(lines[max(i for i, line in enumerate(lines) if line == "{") :]))
    check = gpu_check_module()
    assert summary["dry_run"] is True and summary["device"] == "cpu" and summary["shape"] == "tiny"
    for part in check.PARTS:
        assert summary[part]["status"] == "ok", (part, summary[part])
        assert set(check.FIELDS[part]) <= set(summary[part]), (part, summary[part])
    for part in ("memory_full", "memory_lora"):
        assert summary[part]["estimated_peak_gib"] > 0 and summary[part]["train_tokens_per_s"] > 0
    assert [b["batch"] for b in summary["generation"]["batches"]] == [1, 2]
    assert all(b["decode_tokens_per_s"] > 0 for b in summary["generation"]["batches"])
    assert 0 < summary["drift"]["autocast_mean"] <= summary["drift"]["autocast_max"]
    assert summary["e2e"]["mode"] == "full" and summary["e2e"]["logged"] == 1


@pytest.mark.unit
def test_gpu_check_skips_a_part_whose_budget_no_longer_fits():
    check = gpu_check_module()
    clock = check.Clock(budget_s=check.BUDGETS["drift"] + 5)
    assert clock.begin("drift") and not clock.part_over()
    assert not clock.begin("e2e")  # its budget is above what is left
