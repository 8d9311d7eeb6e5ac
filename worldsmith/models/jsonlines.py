"""Pydantic models as JSON lines: one model per line, read back with the bad line named."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from worldsmith.failures import UserFixable

M = TypeVar("M", bound=BaseModel)


class JsonLinesError(UserFixable, ValueError):
    """A JSON-lines file that cannot be read as the models it should hold: the message names the file,
    the line and the field."""


def _first_problem(exc: ValidationError) -> str:
    """The first error of `exc` as `field a.b: message` (or the message alone when no field is at fault)."""
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"])
    return f"field {field}: {first['msg']}" if field else first["msg"]


def write_models(models: Iterable[BaseModel], path: Path) -> Path:
    """Write one model per line (every field included) into `path`, creating its directory."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for model in models:
            handle.write(model.model_dump_json() + "\n")
    return path


def read_models(cls: type[M], path: Path, what: str) -> list[M]:
    """The models of a JSON-lines file (blank lines skipped); text that is not UTF-8, or a malformed line,
    raises JsonLinesError naming the file, the line, `what` it should have been and the field."""
    try:
        text = path.read_text()  # a missing file, a directory: OSError naming it (the CLI's one line)
    except UnicodeDecodeError as exc:
        raise JsonLinesError(f"cannot read {path}: not UTF-8 text ({exc.reason}); give a JSON lines file") from None
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        if line.strip():
            try:
                out.append(cls.model_validate_json(line))
            except ValidationError as exc:
                raise JsonLinesError(f"{path}:{number}: not {what}: {_first_problem(exc)}") from None
    return out
