"""A real `worldsmith train` (the tiny model, a few short steps) stopped by Ctrl-C (SIGINT) once its first
step is recorded: it ends at the next step boundary with one line naming the checkpoint kept and the
command that resumes (which then finishes the run), the training run `cancelled` in `runs ls --json`, its
Prefect flow run Cancelled, no traceback. SIGTERM in the tiny model's warm-up: nothing cached. Launched
training (torch.distributed.run) asked to stop: its processes are stopped, and the nodes it started."""

from __future__ import annotations

import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from sqlmodel import select
from support.catalog import published_set
from support.processes import listed_runs, run_cli, signalled_after, stop_line

from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import Checkpoint
from worldsmith.storage.catalog import open_catalog
from worldsmith.training.config import TrainingConfig
from worldsmith.training.launch import NodeOutcome, TrainingStopped, TrainRequest, launch

pytestmark = pytest.mark.e2e

#: A short run: 3 steps of 2 rollouts of 2 turns, a checkpoint each step, no validation split.
STEPS = 3
ARGS = ["--group-size", "2", "--steps", str(STEPS), "--save-every", "1", "--max-turns", "2"]
ARGS += ["--max-completion-length", "16", "--warmup-steps", "1"]


def _api_url() -> str:
    """The session's Prefect test server (a settings context, not os.environ)."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


def test_ctrl_c_stops_train_at_a_step_boundary_keeping_its_checkpoint(prefect_api, home):
    from prefect import get_client

    set_name = published_set("stoptrain", [procedural_bundle("retail", 2)], 0.0)
    env = dict(
        os.environ,
        PREFECT_API_URL=_api_url(),
        TRL_EXPERIMENTAL_SILENCE="1",
        **signalled_after("worldsmith.storage.run_records:record_step", signal.SIGINT),  # step 1's metrics row
    )
    done = run_cli(["train", "--set", set_name, *ARGS], env)
    line = stop_line(done, signal.SIGINT)
    output = done.stdout + done.stderr
    # quiet by default: no library progress bar, warning or log line (they are in the log file named)
    assert not any(noise in output for noise in ("FutureWarning", "it/s]", "examples/s]", "Loading weights")), output
    [log] = [line.removeprefix("log: ") for line in done.stderr.splitlines() if line.startswith("log: ")]
    assert "FutureWarning" in Path(log).read_text()  # transformers' gradient_checkpointing deprecation
    [run] = listed_runs("train", env)
    assert run["status"] == "cancelled", run
    with open_catalog().session() as session:
        steps = sorted(
            c.step for c in session.exec(select(Checkpoint).where(Checkpoint.training_run_id == int(run["id"])))
        )
    # the step in flight when the signal came (2) finished and saved, no later one ran, no final model
    assert steps == [1, 2], steps
    assert line.endswith(
        f"training run {run['id']} cancelled after step 2 of {STEPS}; its trainer checkpoint of step 2 kept; "
        f"to resume, run: worldsmith resume {run['id']}"
    ), line
    with get_client(sync_client=True) as client:
        assert client.read_flow_run(run["flow_run_id"]).state_name == "Cancelled"

    resumed = run_cli(
        ["resume", str(run["id"]), "--json"], {k: v for k, v in env.items() if not k.startswith("WORLDSMITH_TEST_KILL")}
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    result = json.loads(resumed.stdout)
    assert (result["run_id"], result["resumed_from"], result["steps"]) == (int(run["id"]), 2, STEPS), result


@dataclass
class NeverStartedNode:
    """Node 1 of a two-node run that never starts (node 0 waits for it at its rendezvous), and its launcher."""

    name: str = "node 1 of 2 (never started)"
    stopped: bool = False

    def outcome(self) -> NodeOutcome | None:
        return None

    def started(self) -> bool:
        return False

    def waiting_reason(self) -> str:
        return "it never starts"

    def stop(self) -> None:
        self.stopped = True

    def start(self, request: TrainRequest, node_rank: int, rendezvous: object) -> NeverStartedNode:
        """As its own launcher: the node started."""
        return self


def test_a_stop_request_stops_launched_training_and_its_nodes(tmp_path):
    node = NeverStartedNode()
    config = TrainingConfig(model="never-loaded", set_name="none", nodes=2, rendezvous_timeout_s=600)
    request = TrainRequest(config=config, model="never-loaded", bundles=[], run_id=1, output=str(tmp_path / "out"))
    before = set(psutil.Process().children(recursive=True))  # a session's Prefect server, say
    with pytest.raises(TrainingStopped):
        launch(request, 1, node, stop_requested=lambda: True)
    assert node.stopped
    assert set(psutil.Process().children(recursive=True)) == before  # node 0's torch.distributed.run agent is gone


def test_sigterm_in_the_warm_up_caches_no_half_warmed_model(prefect_api, home):
    """Stopped as the tiny model's warm-up starts: it ends at a step boundary and is not cached (a later
    run would train from it), the run `cancelled` before its first step with nothing to resume from."""
    set_name = published_set("stopwarm", [procedural_bundle("retail", 2)], 0.0)
    env = dict(
        os.environ,
        PREFECT_API_URL=_api_url(),
        TRL_EXPERIMENTAL_SILENCE="1",
        **signalled_after("worldsmith.training.warmup:reference_rows", signal.SIGTERM),  # the warm-up's rows made
    )
    args = ["train", "--set", set_name, *ARGS[: ARGS.index("--warmup-steps")], "--warmup-steps", "5"]
    done = run_cli(args, env)
    output = done.stdout + done.stderr
    assert done.returncode == 128 + signal.SIGTERM and "Traceback" not in output, output
    assert done.stderr.splitlines()[-1].startswith(
        "interrupted by SIGTERM: training run 1 cancelled before its first step; no trainer checkpoint kept"
    ), output
    assert not list((home / "models").glob("tiny-*"))  # nothing cached
