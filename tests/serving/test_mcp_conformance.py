"""The official MCP conformance suite (@modelcontextprotocol/conformance) against `worldsmith env serve`,
run as scripts/mcp-conformance.sh runs it: every scenario that applies passes (docs/testing.md lists
those that do not, and why)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from support.paths import REPO

pytestmark = pytest.mark.e2e

SCRIPT = REPO / "scripts" / "mcp-conformance.sh"
#: Where the script installs the suite and Node 22 (git-ignored); .ci/run installs them.
SUITE = REPO / ".venv" / "conformance" / "node_modules" / ".bin" / "conformance"


@pytest.mark.timeout(600)
def test_every_conformance_scenario_that_applies_to_env_serve_passes():
    if not SUITE.exists():
        reason = f"the MCP conformance suite is not installed: scripts/mcp-conformance.sh --install puts it in {SUITE}"
        if os.environ.get("CI"):
            pytest.fail(f"required in CI (.ci/run installs it): {reason}")
        pytest.skip(reason)
    env = {**os.environ, "MCP_CONFORMANCE_PYTHON": sys.executable}
    done = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=540, cwd=REPO, env=env)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert "dns-rebinding-protection: 2 passed, 0 failed" in done.stdout
