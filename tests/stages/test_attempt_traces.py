"""What each stage attempt keeps (its prompt, answer, files, evidence; bounded), the procedural backend's fault
that survives repair, and the files a world failed by it is published with."""

from __future__ import annotations

import json

import pytest
from sqlmodel import select

from worldsmith.llm.backend import Prompt
from worldsmith.llm.procedural.backend import ProceduralGenerator
from worldsmith.models.catalog import StageAttempt
from worldsmith.models.specs import SchemaSpec, SolutionStep, TaskSolution, VerifierCode
from worldsmith.stages.attempts import AttemptLog, AttemptTrace, spec_files
from worldsmith.stages.pipeline import build_environment
from worldsmith.stages.scenario import DEFAULT_SCENARIOS, load_scenarios
from worldsmith.stages.work import EnvWork
from worldsmith.storage.attempt_artifacts import MAX_ARTIFACT_BYTES, attempt_artifacts
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.failed_worlds import failed_world_files
from worldsmith.storage.objectstore import LocalStore
from worldsmith.storage.publish import publish_failed

SCENARIO = load_scenarios(DEFAULT_SCENARIOS)[0]


@pytest.mark.unit
def test_an_answers_files_are_its_text_fields_and_the_rest_as_json():
    assert spec_files(SchemaSpec(schema_sql="CREATE TABLE t (id INTEGER);")) == {
        "schema.sql": "CREATE TABLE t (id INTEGER);"
    }
    rule = {"id": "one_row", "statement": "t holds at most one row", "sql": "SELECT id FROM t LIMIT -1 OFFSET 1"}
    stated = spec_files(SchemaSpec(schema_sql="CREATE TABLE t (id INTEGER);", invariants=[rule]))
    assert json.loads(stated["schema_spec.json"]) == {"invariants": [rule]}
    step = SolutionStep(tool="list_users", arguments={})
    code = VerifierCode(verifiers_py="def verify_t01(): ...", solutions=[TaskSolution(task_id="t01", solution=[step])])
    files = spec_files(code)
    assert set(files) == {"verifiers.py", "verifier_code.json"}
    assert json.loads(files["verifier_code.json"])["solutions"][0]["task_id"] == "t01"


@pytest.mark.unit
def test_a_trace_longer_than_the_bound_is_stored_cut_and_marked():
    huge = "é" * MAX_ARTIFACT_BYTES  # two bytes each: cut on a character
    files = {f.name: f for f in AttemptTrace(Prompt("seed", huge, "write the seed"), huge).files()}
    answer = files["answer.txt"]
    assert answer.full_size == 2 * MAX_ARTIFACT_BYTES and len(answer.text.encode()) < MAX_ARTIFACT_BYTES + 100
    assert answer.text.endswith(f"[truncated at {MAX_ARTIFACT_BYTES} bytes of {2 * MAX_ARTIFACT_BYTES}]\n")
    messages = json.loads(files["messages.json"].text)  # still JSON: each message is cut, not the file
    assert [m["role"] for m in messages] == ["system", "user"] and "truncated at" in messages[0]["content"]
    assert messages[1]["content"] == "write the seed"


@pytest.mark.unit
def test_a_persistent_fault_survives_every_repair_and_moves_each_time():
    generator = ProceduralGenerator(seed=0, persistent_fault_rate=1.0)
    work = EnvWork.start(SCENARIO, 0)
    answers = [
        generator.answer_text(work.prompt("seed", feedback, schema="", invariants="", tasks=""))
        for feedback in (None, "a", "b")
    ]
    assert len(set(answers)) == 3  # another dangling parent each time
    healthy = ProceduralGenerator(seed=0).answer_text(work.prompt("seed", None, schema="", invariants="", tasks=""))
    assert all(answer != healthy for answer in answers)
    assert generator.answer_text(work.prompt("schema", "a", tasks="")) == ProceduralGenerator(seed=0).answer_text(
        work.prompt("schema", "a", tasks="")
    )  # only the seed step


@pytest.mark.sandbox
def test_a_world_failed_at_its_seed_is_published_with_its_schema_and_failing_attempt(runtime, tmp_path):
    catalog, store = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}"), LocalStore(tmp_path / "store")
    log = AttemptLog("run", catalog, store)
    generator = ProceduralGenerator(seed=2, fault_rate=1.0, persistent_fault_rate=1.0)
    result = build_environment(SCENARIO, 2, generator, runtime, log, max_attempts=2)
    assert result.failed_stage == "database:seed" and result.reason
    with catalog.session() as session:
        attempts = session.exec(select(StageAttempt)).all()
        kept = {a.stage: {x.name for x in attempt_artifacts(session, store, a.id)} for a in attempts}
    assert kept["tasks"] >= {"messages.json", "answer.txt", "task_list.json"}
    assert kept["database:seed"] == {"messages.json", "answer.txt", "seed.sql"}

    work = EnvWork.start(SCENARIO, 2)  # the work the flow holds: the database stage never returned
    files = failed_world_files(work.env_id, work.partial_files(), result.failed_stage, result.reason, catalog, store)
    assert "CREATE TABLE" in files["schema.sql"].decode()  # the schema step passed: its file is kept
    assert "seed.sql" not in files and b"INSERT INTO" in files["failed_attempt/seed.sql"]
    assert b"FOREIGN KEY" in files["failed_attempt/error.txt"]
    assert files["FAILED.md"].decode().startswith(f"# {work.env_id} failed at stage database:seed")
    again = failed_world_files(work.env_id, work.partial_files(), result.failed_stage, result.reason, catalog, store)
    manifest = work.manifest(generator)
    first = publish_failed(manifest, files, result.failed_stage, result.reason, store, catalog)
    assert not publish_failed(manifest, again, result.failed_stage, result.reason, store, catalog).created
    assert first.created
