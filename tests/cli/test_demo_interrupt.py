"""A real `worldsmith demo` stopped by Ctrl-C (SIGINT) once its first world is published: the generation
step stops as `generate` does (its flow run Cancelled on the demo's own Prefect server, the finished world
kept, no failure recorded, its sandboxes gone), the steps after it do not run, and one line says what was
kept, that the stack is still up and how to go on; no traceback."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import httpx
import pytest
from sqlmodel import select
from support.paths import REPO
from support.patience import MOMENTS_S, PROCESS_S
from support.processes import signalled_after, stop_line
from support.tiers import HANG_GUARD_S

from worldsmith.localserver import free_port
from worldsmith.models.catalog import EnvironmentVersion, StageAttempt
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.e2e


@pytest.mark.timeout(HANG_GUARD_S["e2e"])
def test_ctrl_c_stops_the_demo_in_its_step_keeping_what_it_made(tmp_path: Path):
    home = tmp_path / "home"
    temp = Path(tempfile.mkdtemp(prefix="worldsmith-test-tmp-"))  # where its sandboxes' scratch goes
    temp.chmod(0o1777)  # like the system's: the workers' unprivileged uid reaches their scratch
    env = dict(
        os.environ,
        WORLDSMITH_HOME=str(home),
        PREFECT_HOME=str(home / "prefect"),
        WORLDSMITH_PREFECT_PORT=str(free_port()),
        WORLDSMITH_DASHBOARD_PORT=str(free_port()),
        WORLDSMITH_SANDBOX_WORKERS="1",
        TMPDIR=str(temp),
    )
    env.pop("PREFECT_API_URL", None)  # the demo's own server
    args = ["demo", "--envs", "4", "--fault-rate", "0", "--persistent-fault-rate", "0"]
    try:
        done = subprocess.run(
            [sys.executable, "-m", "worldsmith.cli", *args],
            cwd=REPO,
            env={**env, **signalled_after("worldsmith.storage.publish:publish", signal.SIGINT)},
            capture_output=True,
            text=True,
            timeout=PROCESS_S,  # up to its first world: about a minute on 2 idle cores
        )
        line = stop_line(done, signal.SIGINT)
        assert "demo stopped in its generate step (" in line and "steps done: up;" in line, line
        assert "the local stack is still up" in line and "run `worldsmith demo` again" in line, line
        assert "3. curate" not in done.stdout  # the steps after it did not run

        with Catalog(f"sqlite:///{home / 'catalog.db'}").session() as session:
            versions = session.exec(select(EnvironmentVersion)).all()
            failures = session.exec(select(StageAttempt).where(StageAttempt.outcome != "success")).all()
        assert 1 <= len(versions) < 4 and f"{len(versions)} of 4 worlds kept" in line, (versions, line)
        assert failures == [], failures  # the stop recorded no failure
        api = f"http://127.0.0.1:{env['WORLDSMITH_PREFECT_PORT']}/api"
        runs = httpx.post(f"{api}/flow_runs/filter", json={}, timeout=MOMENTS_S).json()
        started = [r["state_name"] for r in runs if r["state_type"] != "SCHEDULED"]  # not the deployments' next
        assert started == ["Cancelled"], runs  # the generate flow run
        assert not list(temp.glob("worldsmith-sandbox-*"))  # its sandboxes went with it
    finally:
        subprocess.run(
            [sys.executable, "-m", "worldsmith.cli", "down"], cwd=REPO, env=env, capture_output=True, timeout=PROCESS_S
        )
        shutil.rmtree(temp, ignore_errors=True)
