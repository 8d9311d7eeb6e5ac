"""What each stage's prompt gives a stateless model, and where a failure's feedback goes: the verifiers
prompt shows the seed rows the tasks name with the next ids, the coverage check and validation feed
their errors to the step that must fix them (the steps before it kept). The generator is the
procedural backend behind a recorder that keeps every prompt and may rewrite an answer, as a model
getting one step wrong would."""

from __future__ import annotations

import ast
import json
import re
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from worldsmith.bundle.sqlscript import build_world, split_statements
from worldsmith.bundle.toolspec import derive_tool_schemas
from worldsmith.llm.backend import Generation, Prompt, Spec, Usage, decode
from worldsmith.llm.procedural.backend import ProceduralGenerator, world_for
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.probe_results import ProbeFailure, ProbeResult
from worldsmith.quality.probes import SeedValues, sample_arguments
from worldsmith.quality.seedview import seed_view
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.database import run_database_stage
from worldsmith.stages.order import Stage
from worldsmith.stages.pipeline import build_environment
from worldsmith.stages.scenario import load_scenarios
from worldsmith.stages.task_list import run_tasks_stage
from worldsmith.stages.validate import _route
from worldsmith.stages.work import EnvWork

pytestmark = pytest.mark.sandbox

SCENARIOS = load_scenarios(None)
Rewrite = Callable[[Prompt, str], str]


@dataclass
class Recorder:
    """A Generator: the procedural backend's answers, passed through `rewrite`, every prompt kept."""

    rewrite: Rewrite = lambda prompt, text: text
    seed: int = 0
    prompts: list[Prompt] = field(default_factory=list)
    answers: list[str] = field(default_factory=list)  # the answers to the seed step, in order
    backend: str = "procedural"
    model: str = "procedural-recorded"

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        self.prompts.append(prompt)
        text = self.rewrite(prompt, ProceduralGenerator(seed=self.seed).answer_text(prompt))
        self.answers += [text] if prompt.stage == "seed" else []
        usage = Usage(calls=1)
        return Generation(decode(text, spec, usage), usage, text)

    def asked(self, stage: str) -> list[Prompt]:
        return [p for p in self.prompts if p.stage == stage]


def _seed_rows(user: str) -> list[str]:
    """The lines of the verifiers prompt's seed-rows section."""
    return user.split("\nSeed rows")[1].split("\n\nTools:")[0].splitlines()


def test_the_verifiers_prompt_shows_the_seed_rows_each_task_names_with_the_next_ids(runtime):
    scenario, seed = SCENARIOS[0], 4
    recorder = Recorder(seed=seed)
    result = build_environment(scenario, seed, recorder, runtime, AttemptLog("prompts"))
    assert result.good
    (prompt,) = recorder.asked("verifiers")
    rows = _seed_rows(prompt.user)
    named = [e for t in world_for(scenario, seed).tasks for e in t.entities if not e.isdigit()]
    assert named and all(any(repr(e) in row for row in rows) for e in named)
    conn = sqlite3.connect(":memory:")
    conn.deserialize(result.bundle.world)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
    with_ids = [
        t for t in tables if ("id", "INTEGER") in {(c[1], c[2]) for c in conn.execute(f'PRAGMA table_info("{t}")')}
    ]
    assert with_ids
    for table in with_ids:
        expected = conn.execute(f'SELECT coalesce(max(id), 0) + 1 FROM "{table}"').fetchone()[0]
        head = next(row for row in rows if row.startswith(f"{table} ("))
        assert f"the next inserted row gets id {expected})" in head
    work = EnvWork.start(scenario, seed)
    for stage in ("tool_plan", "tool_code", "verifiers", "seed"):
        user = recorder.asked(stage)[0].user
        assert work.now in user and "The agent acts as the " in user and "operator" in user


@pytest.mark.unit
def test_the_seed_view_shows_the_rows_a_task_needs_within_its_bound():
    schema = (
        "CREATE TABLE owners (id INTEGER PRIMARY KEY AUTOINCREMENT, email TEXT NOT NULL);\n"
        "CREATE TABLE pets (id INTEGER PRIMARY KEY, owner_id INTEGER NOT NULL REFERENCES owners(id), name TEXT);\n"
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);\n"
    )
    conn = sqlite3.connect(":memory:")  # a database no seed.sql makes: AUTOINCREMENT after a deletion
    conn.executescript(
        schema + "INSERT INTO owners (email) VALUES ('ann@example.com'), ('bob@example.com'), ('gone@example.com');\n"
        "DELETE FROM owners WHERE email = 'gone@example.com';\n"
        "INSERT INTO pets (id, owner_id, name) VALUES (7, 2, 'Rex'), (8, 1, 'Tom');\n"
    )
    conn.executemany("INSERT INTO notes (body) VALUES (?)", [(f"note {i} " * 20,) for i in range(300)])
    world = conn.serialize()
    view = seed_view(world, ["Rex"], limit=3000)
    assert len(view) <= 3000
    assert "owners (2 rows; the next inserted row gets id 4)" in view  # AUTOINCREMENT never reuses id 3
    assert "pets (2 rows; the next inserted row gets id 9)" in view
    assert "(7, 2, 'Rex')" in view and "'bob@example.com'" in view  # the named row and the owner it references
    assert "notes (300 rows; the next inserted row gets id 301)" in view and "more rows" in view


def _first_text_entity(scenario, seed) -> str:
    world = world_for(scenario, seed)
    return next(e for t in world.tasks for e in t.entities if not e.isdigit() and "'" not in e)


@pytest.mark.unit
def test_coverage_feeds_a_missing_entity_back_to_the_seed_step_only():
    scenario, seed = SCENARIOS[1], 3
    renamed, newcomer = _first_text_entity(scenario, seed), "Zelda Quartermaine"

    def rewrite(prompt: Prompt, text: str) -> str:
        if prompt.stage == "tasks":  # the tasks name someone the seed will not hold at first
            return text.replace(renamed, newcomer)
        if prompt.stage == "seed" and newcomer in (prompt.context.get("feedback") or ""):
            return text.replace(renamed.replace("'", "''"), newcomer)
        return text

    recorder, log = Recorder(rewrite, seed), AttemptLog("coverage")
    work = run_tasks_stage(EnvWork.start(scenario, seed), recorder, log, 3)
    work = run_database_stage(work, recorder, log, 3)
    attempts = [(a.stage, a.outcome, a.error_class) for a in log.attempts]
    assert attempts[1:] == [
        ("database:schema", "success", None),
        ("database:seed", "failure", "coverage"),
        ("database:seed", "success", None),
    ]
    owner = next(t.id for t in work.tasks.tasks if newcomer in t.entities)
    feedback = recorder.asked("seed")[1].context["feedback"]
    assert f"{owner} names {newcomer!r}" in feedback and len(recorder.asked("schema")) == 1
    assert newcomer in work.seed_sql


def _untouched_leaf_table(scenario, seed) -> str:
    """A table no other table references and no tool or verifier reads."""
    world = world_for(scenario, seed)
    code = world.tools_py + world.verifiers_py
    tables = re.findall(r"CREATE TABLE (\w+)", world.schema_sql)
    return next(
        t
        for t in tables
        if not re.search(rf"(FROM|JOIN)\s+\"?{t}\b", code) and not re.search(rf"REFERENCES {t}\b", world.schema_sql)
    )


def test_a_seed_error_found_by_validation_goes_to_the_seed_step_with_the_schema_kept(runtime):
    scenario, seed = SCENARIOS[2], 6
    empty = _untouched_leaf_table(scenario, seed)

    def rewrite(prompt: Prompt, text: str) -> str:
        if prompt.stage != "seed" or prompt.context.get("feedback"):
            return text
        sql = json.loads(text)["seed_sql"]  # the first seed leaves a table empty: it builds, but fails expectations
        kept = [s.sql for s in split_statements(sql) if not re.match(rf"INSERT INTO \"?{empty}\b", s.sql)]
        return json.dumps({"seed_sql": "\n\n".join(kept)})

    recorder, log = Recorder(rewrite, seed), AttemptLog("seed-route")
    result = build_environment(scenario, seed, recorder, runtime, log)
    assert result.good
    validations = [a for a in log.attempts if a.stage == Stage.VALIDATE.value]
    assert [a.error_class for a in validations] == ["back_to_database:seed", None]
    first, second = recorder.asked("seed")
    assert not first.context["feedback"] and empty in second.context["feedback"]
    assert second.context["feedback"] in second.user
    # the validation's error is the error of the accepted answer, shown whole in the repair prompt
    shown = second.user.split("=== Attempt 1: rejected")[1]
    assert empty in shown.split("Answer:")[0] and json.loads(recorder.answers[0])["seed_sql"] in shown
    assert len(recorder.asked("schema")) == 1 and len(recorder.asked("tasks")) == 1
    assert len(recorder.asked("tool_plan")) == 2  # the stages after the database run again


def _crash_for_solution_only(scenario, seed) -> tuple[str, str, int]:
    """A tool, argument and value a reference solution calls it with, which the tools stage's probe
    (seed-data arguments) does not."""
    world = world_for(scenario, seed)
    built, _ = build_world(world.schema_sql, world.seed_sql)
    tools = {t["name"]: t for t in derive_tool_schemas(world.tools_py)[0]}
    for task in world.tasks:
        for step in task.solution:
            sample = sample_arguments(tools[step.tool], SeedValues(built))
            for name, value in step.arguments.items():
                if isinstance(value, int) and name in sample and sample[name] != value:
                    return step.tool, name, value
    raise AssertionError("no solution step calls a tool with other arguments than the probe's")


def _guarded(tools_py: str, tool: str, argument: str, value: int) -> str:
    function = next(n for n in ast.parse(tools_py).body if isinstance(n, ast.FunctionDef) and n.name == tool)
    lines = tools_py.splitlines()
    at = function.body[1].lineno - 1  # after the docstring
    lines.insert(at, f"    if {argument} == {value}:\n        raise RuntimeError('crash for test')")
    return "\n".join(lines)


def test_a_tool_crash_found_by_validation_goes_to_the_code_step_with_the_plan_kept(runtime):
    scenario, seed = SCENARIOS[3], 8
    tool, argument, value = _crash_for_solution_only(scenario, seed)

    def rewrite(prompt: Prompt, text: str) -> str:
        if prompt.stage != "tool_code" or prompt.context.get("feedback"):
            return text
        return json.dumps({"tools_py": _guarded(json.loads(text)["tools_py"], tool, argument, value)})

    recorder, log = Recorder(rewrite, seed), AttemptLog("code-route")
    result = build_environment(scenario, seed, recorder, runtime, log)
    assert result.good
    validations = [a for a in log.attempts if a.stage == Stage.VALIDATE.value]
    assert [a.error_class for a in validations] == ["back_to_tools:code", None]
    first, second = recorder.asked("tool_code")
    assert not first.context["feedback"] and tool in second.context["feedback"]
    assert "crash for test" in second.user
    assert len(recorder.asked("tool_plan")) == 1 and len(recorder.asked("schema")) == 1


@pytest.mark.unit
def test_validation_routes_each_failure_to_the_step_that_owns_it():
    def probes(*failed: tuple[ProbeFailure, str]) -> QualityCheck:
        return QualityCheck("probes", False, {}, [ProbeResult.failing(f, "x", d).record() for f, d in failed])

    expectations = QualityCheck("expectations", False, {"reason": "table notes is empty"}, [{"table": "notes"}])
    crash = (ProbeFailure.TOOL_CRASHED, "boom")
    assert _route([expectations, probes(crash)])[:2] == (Stage.DATABASE, "seed")
    assert _route([probes((ProbeFailure.UNTOUCHED_ACCEPTED, "complete"), crash)])[:2] == (Stage.TOOLS, "code")
    crashed = (ProbeFailure.REFERENCE_STEP_CRASHED, "step 2 (cancel_order) gave env_error: RuntimeError")
    assert _route([probes(crashed)])[:2] == (Stage.TOOLS, "code")
    replay = "tool create_order (step 2): result differs between two replays"
    assert _route([probes((ProbeFailure.REPLAY_DIFFERS_IN_TOOL, replay))])[:2] == (Stage.TOOLS, "code")
    verdict = (ProbeFailure.REPLAY_DIFFERS_IN_VERIFIER, "verifier verify_t01: verdict differs")
    assert _route([probes(verdict)])[:2] == (Stage.VERIFIERS, None)
    assert _route([probes((ProbeFailure.UNTOUCHED_ACCEPTED, "complete"))])[:2] == (Stage.VERIFIERS, None)
