"""Model checkpoints in the object store: a model directory as tar.gz, and its catalog row.

Two kinds share the `checkpoints` table: trainer checkpoints written every `save_every` steps (the
model with the optimizer, scheduler, RNG and trainer state: a run resumes from the latest), and
final models (metrics `final: true`: the weights alone)."""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from sqlmodel import col, select

from worldsmith.models.catalog import Checkpoint
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import configured_store


def tar_directory(directory: Path) -> bytes:
    """Every file below `directory` as a gzipped tar (paths relative to it, in sorted order)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.add(path, arcname=str(path.relative_to(directory)))
    return buffer.getvalue()


def save_checkpoint(run_id: int, directory: Path, step: int, metrics: dict[str, float]) -> str:
    """Store `directory` in the object store and add a checkpoint row of training run `run_id` with its
    numeric `metrics` (a final model's: `final` True); returns the digest."""
    digest = configured_store().put_bytes(tar_directory(directory))
    with open_catalog().session() as session:
        session.add(Checkpoint(training_run_id=run_id, step=step, digest=digest, metrics={**metrics}))
        session.commit()
    return digest


def latest_trainer_checkpoint(run_id: int) -> Checkpoint | None:
    """The latest trainer checkpoint of run `run_id` (final models do not count), or None."""
    with open_catalog().session() as session:
        rows = session.exec(
            select(Checkpoint).where(Checkpoint.training_run_id == run_id).order_by(col(Checkpoint.step).desc())
        ).all()
    return next((row for row in rows if row.metrics.get("final") is not True), None)


def fetch_checkpoint(digest: str, directory: Path) -> Path:
    """Unpack checkpoint `digest` from the object store into `directory` (replacing what is there);
    returns `directory`. Archive members that would land outside it are refused (tarfile's data filter)."""
    if directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(configured_store().get_bytes(digest)), mode="r:gz") as archive:
        archive.extractall(directory, filter="data")
    return directory
