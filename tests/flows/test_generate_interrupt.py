"""A real `worldsmith generate` stopped by Ctrl-C (SIGINT) or SIGTERM once its first world is published:
one line naming what was kept and the command that resumes, the Prefect flow run Cancelled, the
finished world kept, no failure recorded for the stop, no sandbox scratch directory left behind."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlmodel import select
from support.paths import REPO
from support.processes import signalled_after

from worldsmith.models.catalog import EnvironmentVersion, StageAttempt
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.e2e

#: Worlds asked for (one at a time), and a seed no other test's run uses (its flow run is found by it).
COUNT, SEED = 4, 35035


def _flow_run_states(seed: int) -> list[str]:
    """The state names of the `generate` flow runs of the session's Prefect server run with `seed`."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["generate"])))
    return [r.state_name or "" for r in runs if r.parameters.get("params", {}).get("seed") == seed]


@pytest.fixture()
def temp() -> Iterator[Path]:
    """A temp folder of the run's own (TMPDIR), where its sandboxes' scratch directories go: like the
    system's, world-traversable and sticky, so the workers' unprivileged uid reaches their scratch."""
    folder = Path(tempfile.mkdtemp(prefix="worldsmith-test-tmp-"))
    folder.chmod(0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.timeout(600)  # one run of `worldsmith generate` up to its first world: about 15 s on 2 idle cores
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_stops_generate_keeping_its_finished_worlds(
    prefect_api, tmp_path: Path, temp: Path, signum: signal.Signals
):
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context, not os.environ)

    home = tmp_path / "home"
    seed = SEED + signum
    env = dict(
        os.environ,
        WORLDSMITH_HOME=str(home),
        WORLDSMITH_SANDBOX_WORKERS="1",
        PREFECT_API_URL=PREFECT_API_URL.value(),
        TMPDIR=str(temp),
        **signalled_after("worldsmith.storage.publish:publish", signum),
    )
    args = ["generate", "--count", str(COUNT), "--seed", str(seed), "--fault-rate", "0", "--concurrency", "1"]
    done = subprocess.run(
        [sys.executable, "-m", "worldsmith.cli", *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=500
    )
    output = done.stdout + done.stderr
    assert done.returncode == 128 + signum, output
    # no flood: Prefect's lines of the tasks that ran (about ten a world), no traceback, nothing after the stop
    assert "Traceback" not in output and "atexit" not in output and len(output.splitlines()) < 150, output
    lines = [line for line in done.stderr.splitlines() if line.startswith(f"interrupted by {signum.name}: ")]
    assert len(lines) == 1, output
    assert f"run: worldsmith {' '.join(args)}" in lines[0], lines[0]  # the command that resumes

    with Catalog(f"sqlite:///{home / 'catalog.db'}").session() as session:
        versions = session.exec(select(EnvironmentVersion)).all()
        failures = session.exec(select(StageAttempt).where(StageAttempt.outcome != "success")).all()
    assert 1 <= len(versions) < COUNT and all(v.status == "good" for v in versions), versions  # the first kept
    assert f"{len(versions)} of {COUNT} worlds kept" in lines[0], lines[0]
    assert failures == [], failures  # with no faults asked for, the stop recorded no failure either
    assert _flow_run_states(seed) == ["Cancelled"]
    assert not list(temp.glob("worldsmith-sandbox-*"))  # the sandboxes' scratch directories went with them
