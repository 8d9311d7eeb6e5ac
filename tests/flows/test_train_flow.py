"""The `train` flow and `worldsmith train` on a real (test-harness) Prefect server: set -> tiny
model warmed up -> validation evaluated -> GRPO steps -> checkpoint in the object store ->
validation evaluated again, all recorded in the catalog."""

from __future__ import annotations

import io
import json
import os
import tarfile

import pytest
import torch
from sqlmodel import select
from support.catalog import published_set
from typer.testing import CliRunner

from worldsmith.bundle.loader import write_bundle
from worldsmith.cli import app
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.catalog import Checkpoint, EvaluationRun, TrainingRun, TrainingStep
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import open_store
from worldsmith.storage.run_records import add_run
from worldsmith.training.config import TrainingConfig

pytestmark = pytest.mark.flow

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")


@pytest.fixture()
def train_set(home):
    """Two procedural worlds: one in the train split, one in validation."""
    return published_set("trainset", [procedural_bundle("retail", 3), procedural_bundle("clinic", 3)], 0.5)


def test_cli_train_records_the_run_with_its_steps_checkpoint_evaluations(prefect_api, train_set, tmp_path):
    """`worldsmith train --json` (full history, TensorBoard, an output directory): the run, its steps,
    the final model in the object store and the validation evaluated before and after, in the catalog."""
    runner = CliRunner()
    out = tmp_path / "run"
    args = [
        "train",
        "--set",
        train_set,
        "--steps",
        "2",
        "--group-size",
        "2",
        "--max-turns",
        "1",
        "--max-completion-length",
        "16",
        "--learning-rate",
        "1e-4",
        "--history",
        "full",
        "--warmup-steps",
        "1",
        "--tensorboard",
        "--output",
        str(out),
        "--json",
    ]
    done = runner.invoke(app, args)
    assert done.exit_code == 0, done.output
    result = json.loads(done.output[done.output.index("{") :])
    assert result["steps"] == 2 and len(result["log"]) == 2
    assert result["final"] == str(out / "final") and (out / "final" / "config.json").is_file()
    assert list(out.rglob("events.out.tfevents.*"))  # TensorBoard event files under the run's output
    with open_catalog().session() as session:
        run = session.get(TrainingRun, result["run_id"])
        steps = session.exec(
            select(TrainingStep).where(TrainingStep.training_run_id == run.id).order_by(TrainingStep.step)
        ).all()
        checkpoints = session.exec(select(Checkpoint).where(Checkpoint.training_run_id == run.id)).all()
        evaluations = session.exec(select(EvaluationRun).order_by(EvaluationRun.id)).all()
    assert run.status == "completed" and run.finished_at is not None
    assert run.config["model"] == "tiny" and run.config["history"] == "full"
    assert [s.step for s in steps] == [1, 2]
    for step in steps:
        assert {"loss", "reward", "reward_std", "success_rate", "env_error_rate", "turns", "tokens"} <= set(
            step.metrics
        )
    # the final model is in the object store, loadable from the archive
    assert [(c.step, c.digest) for c in checkpoints] == [(2, result["checkpoint"])] and checkpoints[0].metrics[
        "final"
    ] is True
    archive = tarfile.open(
        fileobj=io.BytesIO(open_store(get_settings().resolved_store_url()).get_bytes(result["checkpoint"]))
    )
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(archive.getnames())
    # validation before and after, by the evaluate flow, with the model before and after training
    assert [(e.policy, e.status) for e in evaluations] == [
        (f"hf:{result['model']}", "completed"),
        (f"hf:{result['final']}", "completed"),
    ]
    assert result["before"]["run_id"] == evaluations[0].id and result["after"]["run_id"] == evaluations[1].id
    assert result["before"]["episodes"] == result["after"]["episodes"] == 10


def test_cli_train_refuses_what_cannot_run_naming_why(prefect_api, train_set, tmp_path):
    runner = CliRunner()
    refused = runner.invoke(app, ["train", "--set", train_set, "--history", "full", "--window", "2"])
    assert refused.exit_code == 2 and "window applies to history='windowed' only" in refused.output
    no_model = runner.invoke(app, ["train", "--set", train_set, "--model", str(tmp_path / "nowhere"), "--steps", "1"])
    assert no_model.exit_code == 2 and no_model.output.splitlines() == [
        f"--model {tmp_path / 'nowhere'}: does not exist; give a model directory, an id in the local Hugging Face "
        "cache, or tiny"
    ]
    if not torch.cuda.is_available():
        no_gpu = runner.invoke(app, ["train", "--set", train_set, "--profile", "gpu", "--steps", "1"])
        assert no_gpu.exit_code == 2 and "profile 'gpu' needs a CUDA device" in no_gpu.output
    missing = runner.invoke(app, ["train", "--set", "no-such-set", "--steps", "1"])
    assert missing.exit_code == 2 and "no environment set 'no-such-set'" in missing.output
    assert len(missing.output.strip().splitlines()) == 1, missing.output  # answered before any flow ran


@pytest.mark.e2e
def test_training_step_in_two_processes(home, tiny_model, tmp_path):
    """The launched path of the training step: two processes (gloo on the CPU), rewards gathered
    across them, one writer of the catalog's step rows and of the final model."""
    from worldsmith.training.launch import TrainRequest, launch

    bundle = write_bundle(procedural_bundle("retail", 3), tmp_path / "retail_3")
    run_id = add_run(TrainingRun(config={}))
    config = TrainingConfig(
        model=str(tiny_model),
        set_name="none",
        group_size=2,
        steps=2,
        max_turns=1,
        max_completion_length=8,
        learning_rate=1e-4,
        processes=2,
        save_every=1,
    )
    out = tmp_path / "out"
    result = launch(
        TrainRequest(config=config, model=str(tiny_model), bundles=[str(bundle)], run_id=run_id, output=str(out)), 2
    )
    assert result.processes == 2 and result.steps == 2 and (out / "final" / "model.safetensors").is_file()
    assert [entry["step"] for entry in result.log] == [1, 2]
    with open_catalog().session() as session:
        steps = session.exec(select(TrainingStep).where(TrainingStep.training_run_id == run_id)).all()
        checkpoints = session.exec(
            select(Checkpoint).where(Checkpoint.training_run_id == run_id).order_by(Checkpoint.step)
        ).all()
    assert sorted(s.step for s in steps) == [1, 2]  # written once, by the main process
    # trainer checkpoints stored once each, after both processes wrote their RNG state into them
    assert [(c.step, c.digest) for c in checkpoints] == result.checkpoints and len(checkpoints) == 2
    archive = tarfile.open(
        fileobj=io.BytesIO(open_store(get_settings().resolved_store_url()).get_bytes(checkpoints[0].digest))
    )
    assert {"rng_state_0.pth", "rng_state_1.pth", "optimizer.pt", "trainer_state.json"} <= set(archive.getnames())
    failed = TrainRequest(
        config=config,
        model=str(tmp_path / "nowhere"),
        bundles=[str(bundle)],
        run_id=run_id,
        output=str(tmp_path / "bad"),
    )
    with pytest.raises(RuntimeError, match="training in 2 processes failed"):
        launch(failed, 2)
