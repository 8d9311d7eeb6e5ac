"""Model checkpoints in the object store: a model directory as tar.gz, and its catalog row."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path
from typing import Any

from worldsmith.models.catalog import Checkpoint
from worldsmith.settings import get_settings
from worldsmith.storage.catalog import open_catalog
from worldsmith.storage.objectstore import open_store


def tar_directory(directory: Path) -> bytes:
    """Every file below `directory` as a gzipped tar (paths relative to it, in sorted order)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(directory.rglob("*")):
            if path.is_file():
                archive.add(path, arcname=str(path.relative_to(directory)))
    return buffer.getvalue()


def save_checkpoint(run_id: int, directory: Path, step: int, metrics: dict[str, Any]) -> str:
    """Store `directory` in the object store and add a checkpoint row of training run `run_id`; returns the digest."""
    settings = get_settings()
    store = open_store(settings.resolved_store_url(), endpoint_url=settings.s3_endpoint_url)
    digest = store.put_bytes(tar_directory(directory))
    with open_catalog().session() as session:
        session.add(Checkpoint(training_run_id=run_id, step=step, digest=digest, metrics=metrics))
        session.commit()
    return digest
