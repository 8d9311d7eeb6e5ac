"""A real `worldsmith cotrain` (the tiny policy and world model, two short rounds) stopped by Ctrl-C (SIGINT)
as its first round ends: it stops before the second with one line naming the round and the models kept and
the command that goes on from them, the co-training run `cancelled` in `runs ls --json` (none of its runs
failed), its Prefect flow run Cancelled, no traceback."""

from __future__ import annotations

import os
import signal

import pytest
from sqlmodel import select
from support.catalog import published_set
from support.processes import listed_runs, run_cli, signalled_after, stop_line

from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import TrainingRun
from worldsmith.storage.catalog import open_catalog

pytestmark = pytest.mark.e2e

ROUNDS = 2
ARGS = ["--rounds", str(ROUNDS), "--policy-steps", "1", "--wm-steps", "2", "--group-size", "2"]
ARGS += ["--real-samples", "1", "--max-turns", "2", "--max-completion-length", "16", "--max-new-tokens", "16"]
ARGS += ["--warmup-steps", "1"]


def test_ctrl_c_stops_cotrain_between_rounds_keeping_the_rounds_done(prefect_api, home):
    from prefect import get_client
    from prefect.settings import PREFECT_API_URL  # the session's test server (a settings context, not os.environ)

    set_name = published_set("stopco", [procedural_bundle("retail", 2)], 0.0)
    env = dict(
        os.environ,
        PREFECT_API_URL=str(PREFECT_API_URL.value()),
        TRL_EXPERIMENTAL_SILENCE="1",
        **signalled_after("worldsmith.flows.cotrain:run_round", signal.SIGINT),  # round 1 done
    )
    done = run_cli(["cotrain", "--set", set_name, *ARGS], env)
    line = stop_line(done, signal.SIGINT)
    [run] = listed_runs("cotrain", env)
    assert run["status"] == "cancelled", run
    with open_catalog().session() as session:
        statuses = {r.status for r in session.exec(select(TrainingRun)).all()}
        cotraining = session.get(TrainingRun, int(run["id"]))
    assert statuses == {"completed", "cancelled"}, statuses  # round 1's runs completed; nothing failed
    assert cotraining is not None and cotraining.metrics["rounds"] == 1
    assert f"co-training run {run['id']} cancelled after round 1 of {ROUNDS}" in line, line
    assert "round-1/policy" in line and "run the command again with --model " in line, line  # how to go on
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run["flow_run_id"]).state_name == "Cancelled"
