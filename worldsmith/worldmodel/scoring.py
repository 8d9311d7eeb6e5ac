"""How a predicted (observation, diff) compares with the real one.

- observation exact match: status, value and error all equal (values compared as canonical JSON);
- outcome agreement: both say the call succeeded, or both say it did not;
- diff precision, recall and F1 at two levels, micro-averaged over transitions:
  rows (table, operation, row identity) and fields (row facts plus each changed column and its
  new value; a deleted row is one fact). With nothing predicted and nothing true, both are 1.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worldsmith.jsonvalue import JsonValue
from worldsmith.models.world_model_scores import PrecisionRecall
from worldsmith.worldmodel.transitions import Observation, diff_part


def canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str)


def observation_match(predicted: Observation | None, true: Observation) -> bool:
    return predicted is not None and (predicted.status, canonical(predicted.value), predicted.error) == (
        true.status,
        canonical(true.value),
        true.error,
    )


def outcome_agreement(predicted: Observation | None, true: Observation) -> bool:
    return predicted is not None and (predicted.status == "ok") == (true.status == "ok")


def _identity(row: Mapping[str, JsonValue]) -> str:
    return canonical({"id": row["id"]}) if "id" in row else canonical(row)


def facts(diff: Mapping[str, JsonValue]) -> tuple[set[tuple[str, ...]], set[tuple[str, ...]]]:
    """(row facts, field facts) of a diff `{table: {inserted, updated, deleted}}`; malformed parts count as nothing."""
    rows: set[tuple[str, ...]] = set()
    fields: set[tuple[str, ...]] = set()
    for table, changes in (diff or {}).items():
        if not isinstance(changes, dict):
            continue
        for row in diff_part(changes, "inserted"):
            if isinstance(row, dict):
                rows.add((table, "insert", _identity(row)))
                fields.update(
                    (table, "insert", _identity(row), column, canonical(value)) for column, value in row.items()
                )
        for change in diff_part(changes, "updated"):
            after = change.get("after") if isinstance(change, dict) else None
            if isinstance(change, dict) and isinstance(after, dict):
                key = canonical(change.get("key"))
                rows.add((table, "update", key))
                before = change.get("before")
                known = before if isinstance(before, dict) else {}
                fields.update(
                    (table, "update", key, column, canonical(value))
                    for column, value in after.items()
                    if known.get(column, object()) != value
                )
        for row in diff_part(changes, "deleted"):
            if isinstance(row, dict):
                rows.add((table, "delete", _identity(row)))
                fields.add((table, "delete", _identity(row)))
    return rows, fields


@dataclass
class Counts:
    """True positives, false positives and false negatives, summed over transitions."""

    tp: int = 0
    fp: int = 0
    fn: int = 0

    def add(self, predicted: set[tuple[Any, ...]], true: set[tuple[Any, ...]]) -> None:
        self.tp += len(predicted & true)
        self.fp += len(predicted - true)
        self.fn += len(true - predicted)

    def scores(self) -> PrecisionRecall:
        precision = self.tp / (self.tp + self.fp) if self.tp + self.fp else 1.0
        recall = self.tp / (self.tp + self.fn) if self.tp + self.fn else 1.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        return PrecisionRecall(precision=precision, recall=recall, f1=f1)
