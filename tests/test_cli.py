"""The `worldsmith env ...` commands and the demo, as a user runs them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from worldsmith.bundle.loader import rebuild_bundle_dir
from worldsmith.cli import app

from conftest import GOLDEN, REPO

runner = CliRunner()


def test_env_check_passes_on_the_golden_bundle():
    result = runner.invoke(app, ["env", "check", str(GOLDEN)])
    assert result.exit_code == 0, result.output
    assert "46 passed, 0 failed" in result.output
    assert "untouched rejected" in result.output and "reference accepted" in result.output


def test_env_check_fails_when_a_verifier_accepts_the_untouched_state(tmp_path: Path):
    bundle = tmp_path / "lenient"
    shutil.copytree(GOLDEN, bundle)
    verifiers = (bundle / "verifiers.py").read_text().replace(
        "def verify_t05_ship_paid_orders(initial, final, answer):\n",
        "def verify_t05_ship_paid_orders(initial, final, answer):\n    return _result('complete')\n",
    )
    (bundle / "verifiers.py").write_text(verifiers)
    rebuild_bundle_dir(bundle)
    result = runner.invoke(app, ["env", "check", str(bundle)])
    assert result.exit_code == 1
    assert "45 passed, 1 failed" in result.output
    line = next(l for l in result.output.splitlines() if "t05_ship_paid_orders" in l and "untouched" in l)
    assert "FAIL" in line and "complete" in line


def test_env_check_fails_when_a_tool_crashes(tmp_path: Path):
    bundle = tmp_path / "crashy"
    shutil.copytree(GOLDEN, bundle)
    tools = (bundle / "tools.py").read_text().replace(
        '    return dict(_product_by_sku(conn, sku))\n', '    return dict(_product_by_sku(conn, sku))["no_such_column"]\n'
    )
    (bundle / "tools.py").write_text(tools)
    rebuild_bundle_dir(bundle)
    result = runner.invoke(app, ["env", "check", str(bundle)])
    assert result.exit_code == 1
    line = next(l for l in result.output.splitlines() if "get_product" in l)
    assert "FAIL" in line and "KeyError" in line


def test_env_check_reports_a_malformed_bundle(tmp_path: Path):
    bundle = tmp_path / "broken"
    shutil.copytree(GOLDEN, bundle)
    (bundle / "schema.sql").unlink()
    result = runner.invoke(app, ["env", "check", str(bundle)])
    assert result.exit_code == 2
    assert "schema.sql: missing file" in result.output


def test_env_tools_lists_schemas():
    result = runner.invoke(app, ["env", "tools", str(GOLDEN), "--json"])
    assert result.exit_code == 0
    tools = json.loads(result.output)
    assert tools == json.loads((GOLDEN / "tools.json").read_text())


def test_env_call_runs_one_tool():
    ok = runner.invoke(app, ["env", "call", str(GOLDEN), "get_product", "--args", '{"sku": "KB-101"}'])
    assert ok.exit_code == 0
    assert json.loads(ok.output)["value"]["name"] == "Mechanical Keyboard"
    refused = runner.invoke(app, ["env", "call", str(GOLDEN), "pay_order", "--args", '{"order_id": 1001}'])
    assert refused.exit_code == 1 and json.loads(refused.output)["status"] == "tool_error"
    bad = runner.invoke(app, ["env", "call", str(GOLDEN), "get_product", "--args", "{sku}"])
    assert bad.exit_code == 2 and "--args is not valid JSON" in bad.output


@pytest.mark.slow
def test_demo_main_job_runs_end_to_end(tmp_path):
    env = dict(os.environ, WORLDSMITH_HOME=str(tmp_path / "home"))
    proc = subprocess.run([sys.executable, "-m", "worldsmith.cli", "demo"], cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "expectations: passed" in proc.stdout and "probes: passed" in proc.stdout
    assert "retail_store@1 (good)" in proc.stdout
    assert "10/10 tasks complete; 0 failed quality checks" in proc.stdout
