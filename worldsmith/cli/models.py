"""`worldsmith models fetch`: a trained model out of the object store, by training run."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from worldsmith.cli.console import failure, say

app = typer.Typer(help="Fetch the models training runs stored.", no_args_is_help=True)


@app.command("fetch")
def models_fetch(
    run: Annotated[int, typer.Argument(help="Training run id (`worldsmith runs ls --kind train` lists them).")],
    target: Annotated[Path, typer.Argument(help="Directory to write the model into (new or empty).")],
    step: Annotated[
        int | None, typer.Option(help="The trainer checkpoint of this step instead of the final model.")
    ] = None,
) -> None:
    """Write a training run's final model (or its checkpoint of `--step`) into a directory, as stored."""
    from sqlmodel import col, select

    from worldsmith.models.catalog import Checkpoint, TrainingRun
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.training.checkpoints import fetch_checkpoint

    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise failure(f"{target} exists and is not an empty directory; name a new or empty one")
    with open_catalog().session() as session:
        training_run = session.get(TrainingRun, run)
        if training_run is None:
            raise failure(f"no training run {run} (`worldsmith runs ls --kind train` lists them)")
        stored = session.exec(
            select(Checkpoint)
            .where(Checkpoint.training_run_id == run)
            .order_by(col(Checkpoint.step), col(Checkpoint.id))
        ).all()
    finals = [c for c in stored if c.metrics.get("final") is True]
    steps = sorted({c.step for c in stored if c.metrics.get("final") is not True})
    listed = f"its trainer checkpoints: steps {', '.join(map(str, steps))}" if steps else "no trainer checkpoints"
    if step is None:
        if not finals:
            raise failure(
                f"training run {run} ({training_run.status}) stored no final model; {listed}"
                + (" (fetch one with --step)" if steps else ""),
                code=1,
            )
        chosen = finals[-1]
    else:
        at_step = [c for c in stored if c.step == step and c.metrics.get("final") is not True]
        if not at_step:
            raise failure(f"training run {run} stored no trainer checkpoint at step {step}; {listed}")
        chosen = at_step[-1]
    fetch_checkpoint(chosen.digest, target)
    what = "final model" if step is None else f"trainer checkpoint of step {step}"
    say(f"fetched the {what} of training run {run} ({chosen.digest}) into {target}", highlight=False)
