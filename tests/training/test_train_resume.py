"""A training run killed mid-way loses nothing that was checkpointed: trainer checkpoints reach the
object store as they are written, and `worldsmith resume RUN_ID` continues the same run from the
latest one, giving the same steps as a run that was never interrupted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys

import psutil
import pytest
from sqlmodel import select
from support.catalog import published_set
from support.patience import PROCESS_S
from support.processes import killed_after
from typer.testing import CliRunner

from worldsmith.cli import app
from worldsmith.dashboard.data import training
from worldsmith.flows.train import train
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import Checkpoint, EvaluationRun, TrainingRun, TrainingStep
from worldsmith.models.training import TrainResult
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.run_records import add_run, update_run
from worldsmith.training.checkpoints import fetch_checkpoint
from worldsmith.training.config import TrainingConfig

pytestmark = pytest.mark.e2e

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")

ARGS = {
    "model": "tiny",
    "group_size": 2,
    "steps": 3,
    "save_every": 1,
    "max_turns": 2,
    "max_completion_length": 16,
    "warmup_steps": 1,
    "learning_rate": 1e-4,
}
CLI_ARGS = [
    "--group-size",
    "2",
    "--steps",
    "3",
    "--save-every",
    "1",
    "--max-turns",
    "2",
    "--max-completion-length",
    "16",
    "--warmup-steps",
    "1",
    "--learning-rate",
    "1e-4",
]
COMPARED = ("loss", "reward", "success_rate", "tokens", "grad_norm")


@pytest.fixture(scope="module")
def resume_set(prefect_api, tmp_path_factory: pytest.TempPathFactory):
    """A home of this module's own (WORLDSMITH_HOME while its tests run) holding set `resumeset`."""
    from worldsmith.settings import get_settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("WORLDSMITH_HOME", str(tmp_path_factory.mktemp("resume") / "home"))
        patch.setenv("WORLDSMITH_SANDBOX_WORKERS", "2")
        get_settings.cache_clear()
        yield published_set("resumeset", [procedural_bundle("retail", 4), procedural_bundle("clinic", 4)], 0.5)
    get_settings.cache_clear()


@pytest.fixture(scope="module")
def uninterrupted(resume_set) -> TrainResult:
    """The record of a run of ARGS never interrupted, without validation (the steps are what the
    others compare with); it also builds the tiny model the others reuse."""
    return train(TrainingConfig(set_name=resume_set, **ARGS), with_validation=False)


def rows_of(run_id: int) -> tuple[TrainingRun, list[TrainingStep], list[Checkpoint]]:
    with open_catalog().session() as session:
        run = session.get(TrainingRun, run_id)
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run_id).order_by(TrainingStep.step)
        ).all()
        checkpoints = session.exec(
            select(Checkpoint).where(Checkpoint.training_run_id == run_id).order_by(Checkpoint.id)
        ).all()
    return run, steps, checkpoints


def start_and_kill_after_step_2(set_name: str, api_url: str) -> int:
    """`worldsmith train` in its own process group, SIGKILLed as soon as it has written step 2's
    metrics row (after its step-1 checkpoint, before its step-2 one); returns the run's id."""
    command = [
        sys.executable,
        "-c",
        "from worldsmith.cli import app; app()",
        "train",
        "--set",
        set_name,
        *CLI_ARGS,
        "--json",
    ]
    env = {**os.environ, "PREFECT_API_URL": api_url, **killed_after("worldsmith.storage.run_records:record_step", 2)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=PROCESS_S)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == -signal.SIGKILL, f"exit {process.returncode}: {stderr.decode()[-2000:]}"
    with open_catalog().session() as session:
        newest = session.exec(select(TrainingRun).order_by(TrainingRun.id.desc())).first()
    assert newest.status == "running", (newest.id, newest.status)
    return newest.id


def test_a_killed_run_resumed_from_its_checkpoint_matches_an_uninterrupted_run(resume_set, uninterrupted, tmp_path):
    from prefect.settings import PREFECT_API_URL

    _, whole_steps, whole_checkpoints = rows_of(uninterrupted.run_id)
    assert [c.step for c in whole_checkpoints] == [1, 2, 3, 3] and whole_checkpoints[-1].metrics["final"] is True
    trainer_state = fetch_checkpoint(whole_checkpoints[1].digest, tmp_path / "step-2")  # everything a resume needs
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "model.safetensors"} <= {
        p.name for p in trainer_state.iterdir()
    }
    assert json.loads((trainer_state / "trainer_state.json").read_text())["global_step"] == 2
    assert whole_checkpoints[1].metrics["loss"] == pytest.approx(whole_steps[1].metrics["loss"])

    run_id = start_and_kill_after_step_2(resume_set, PREFECT_API_URL.value())
    killed, steps, checkpoints = rows_of(run_id)
    assert (
        killed.status == "running" and killed.finished_at is None and "before" in killed.metrics
    )  # what a SIGKILL leaves
    with open_catalog().session() as session:
        assert {row["id"]: row["status"] for row in training(session)}[run_id] == "crashed"  # as the dashboard shows it
    assert [c.step for c in checkpoints] == [1] and [s.step for s in steps] == [1, 2]  # step 2 ran past the checkpoint
    resumable = checkpoints[-1].step
    with open_catalog().session() as session:
        evaluations_before = len(session.exec(select(EvaluationRun)).all())

    result = CliRunner().invoke(app, ["resume", str(run_id), "--json"])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout[result.stdout.index("{") :])
    assert record["run_id"] == run_id and record["resumed_from"] == resumable and record["steps"] == 3
    run, steps, checkpoints = rows_of(run_id)
    assert run.status == "completed" and run.metrics["resumed_from_steps"] == [resumable]
    # each step once: the stopped attempt's rows after the checkpoint were replaced
    assert [s.step for s in steps] == [1, 2, 3]
    assert [c.step for c in checkpoints] == [1, 2, 3, 3] and checkpoints[-1].digest == record["checkpoint"]
    # the same steps as the run that was never interrupted: optimizer, scheduler, data order and sampling all continued
    for resumed, reference in zip(steps, whole_steps, strict=True):
        for key in COMPARED:
            assert resumed.metrics[key] == pytest.approx(reference.metrics[key], rel=1e-4, abs=1e-6), (
                resumed.step,
                key,
            )
    # validation before training was not repeated; after training it ran once
    with open_catalog().session() as session:
        assert len(session.exec(select(EvaluationRun)).all()) == evaluations_before + 1
    assert record["before"] == killed.metrics["before"]


def dead_process() -> dict:
    """The owner record of a process that ran on this host and has exited."""
    child = subprocess.Popen([sys.executable, "-c", "import threading; threading.Event().wait()"])  # until killed
    owner = {"host": socket.gethostname(), "pid": child.pid, "started": psutil.Process(child.pid).create_time()}
    child.kill()
    child.wait()
    return owner


def stopped_run(config: dict) -> int:
    """A run row left `running` by a process that died (as a SIGKILL outside a worker leaves it)."""
    run_id = add_run(TrainingRun(config=config))
    update_run(TrainingRun, run_id, {"process": dead_process()})
    return run_id


def test_resume_refusals_name_the_problem(resume_set, uninterrupted):
    runner = CliRunner()
    finished = uninterrupted
    config = TrainingConfig(set_name=resume_set, **ARGS).model_dump()
    alive = add_run(TrainingRun(config=config))  # its process, this one, still runs
    gone = stopped_run(config)
    cases = {
        "999": "no training run 999",
        str(finished.run_id): f"training run {finished.run_id} completed; there is nothing to resume",
        str(
            add_run(TrainingRun(config={"kind": "world_model"}))
        ): "is a world_model run; only GRPO training runs resume",
        str(
            alive
        ): f"training run {alive} is still running (process {os.getpid()} on this host); stop it before resuming",
        str(gone): "has no trainer checkpoint to resume from",
    }
    for run_id, message in cases.items():
        refused = runner.invoke(app, ["resume", run_id])
        assert refused.exit_code == 2 and message in refused.output, (run_id, refused.output)
    with open_catalog().session() as session:
        shown = {row["id"]: row["status"] for row in training(session)}
    assert shown[alive] == "running" and shown[gone] == "crashed"
    unfinished = stopped_run(config)
    with pytest.raises(ValueError, match="these fields differ: learning_rate, steps"):
        train(TrainingConfig(set_name=resume_set, **{**ARGS, "steps": 8, "learning_rate": 1e-3}), resume=unfinished)
    assert rows_of(unfinished)[0].status == "running"  # a refusal leaves the run as it was
