"""Pydantic models as JSON lines: one model per line, read back with the bad line named."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)


def write_models(models: Iterable[BaseModel], path: Path) -> Path:
    """Write one model per line (every field included) into `path`, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for model in models:
            handle.write(model.model_dump_json() + "\n")
    return path


def read_models(cls: type[M], path: Path, what: str) -> list[M]:
    """The models of a JSON-lines file (blank lines skipped); a malformed line raises ValueError
    naming the file, the line and `what` it should have been."""
    out = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if line.strip():
            try:
                out.append(cls.model_validate_json(line))
            except (ValueError, ValidationError) as exc:
                raise ValueError(f"{path}:{number}: not {what} ({str(exc).splitlines()[0]})") from None
    return out
