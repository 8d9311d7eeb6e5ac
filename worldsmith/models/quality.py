"""The outcome of one quality check of an environment version, stored by `publish` as one of its
quality reports (`worldsmith/storage/publish.py`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from worldsmith.jsonvalue import JsonObject


@dataclass
class QualityCheck:
    """One quality check's outcome, to be stored as a quality report of the version."""

    kind: str
    passed: bool
    summary: JsonObject = field(default_factory=dict)
    details: list[JsonObject] = field(default_factory=list)
