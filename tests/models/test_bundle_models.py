"""The bundle's pydantic specs and their JSON-lines files: what a manifest accepts, and a malformed
line named by file, line and what it should have been."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError
from support.paths import GOLDEN

from worldsmith.models.bundle import Manifest, TaskSpec
from worldsmith.models.jsonlines import read_models, write_models
from worldsmith.models.verdict import VERIFIER_VERDICTS, Verdict

pytestmark = pytest.mark.unit

SCENARIO = {"name": "Shop", "description": "a shop", "categories": ["retail"]}


def test_the_golden_manifest_parses() -> None:
    manifest = Manifest.model_validate_json((GOLDEN / "manifest.json").read_text())
    assert manifest.env_id == "retail_store" and manifest.artifacts


def test_the_golden_tasks_parse_each_with_its_solution() -> None:
    tasks = read_models(TaskSpec, GOLDEN / "tasks.jsonl", "a task")
    assert tasks and all(task.solution for task in tasks)


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("env_id", "Retail-Store", "must be snake_case"),
        ("format", "worldsmith-bundle/0", "unsupported bundle format"),
        ("clock", "yesterday", "is not an ISO instant"),
    ],
)
def test_a_manifest_names_what_is_wrong(field: str, value: str, words: str) -> None:
    fields = {"env_id": "shop", "scenario": SCENARIO, field: value}
    with pytest.raises(ValidationError, match=words):
        Manifest.model_validate(fields)


def test_a_manifest_keeps_fields_it_does_not_know() -> None:
    manifest = Manifest.model_validate({"env_id": "shop", "scenario": SCENARIO, "curated_by": "ops"})
    assert json.loads(manifest.model_dump_json())["curated_by"] == "ops"


def test_models_round_trip_through_json_lines(tmp_path: Path) -> None:
    tasks = [TaskSpec(id=f"t{i}", instruction="do it", verifier="verify_t", solution=[]) for i in range(3)]
    path = write_models(tasks, tmp_path / "deep" / "tasks.jsonl")
    assert read_models(TaskSpec, path, "a task") == tasks


def test_a_malformed_jsonl_line_is_named_by_its_location(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "t1", "instruction": "x", "verifier": "v", "solution": []}\n\n{"id": ""}\n')
    with pytest.raises(ValueError, match=rf"{path}:3: not a task"):
        read_models(TaskSpec, path, "a task")


def test_a_verifier_may_say_only_its_three_verdicts() -> None:
    assert set(VERIFIER_VERDICTS) == {Verdict.complete, Verdict.partial, Verdict.incomplete}
    assert Verdict("env_error") is Verdict.env_error and str(Verdict.complete) == "complete"
