"""What a stateless model is told: a repair prompt carries every earlier attempt of the step (answers whole,
or what was cut said), a failure brought back is named, the scenario prompt lists the names taken, the
world's conventions reach every later stage, and the seed excerpts hold the rows the tasks name. The model
is a local OpenAI-compatible server answering from a script."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime

import pytest
from support.llm_server import ProceduralLLM, ScriptedLLM, json_reply
from support.patience import MOMENTS_S

from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.models.catalog import Environment
from worldsmith.quality.seedview import seed_view
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.history import ANSWERS_CHARS, Fault, StepHistory
from worldsmith.stages.pipeline import build_environment
from worldsmith.stages.scenario import catalog_names, expand_scenarios, load_scenarios, taken_lines
from worldsmith.stages.task_list import run_tasks_stage
from worldsmith.stages.work import EnvWork
from worldsmith.storage.catalog import Catalog

pytestmark = pytest.mark.unit

SCENARIOS = load_scenarios(None)


def _generator(url: str) -> OpenAIGenerator:
    return OpenAIGenerator(model="test-model", base_url=url, api_key="sk-test", timeout_s=MOMENTS_S, retries=1)


def _tasks(*ids: str) -> dict[str, object]:
    """A task list whose instructions are long: together well over the 4,000 characters the old prompt kept."""
    long = "Please check every detail of the booking and confirm it with the customer. " * 8
    return {
        "acting_user": {"role": "support operator", "identifier": None},
        "tasks": [{"id": i, "instruction": f"Task {i}: {long}", "entities": []} for i in ids],
    }


def _user(body: dict[str, object]) -> str:
    messages = body["messages"]
    assert isinstance(messages, list)
    return str(messages[1]["content"])


def test_a_repair_prompt_carries_every_attempt_whole_and_names_a_failure_brought_back():
    first = _tasks("a", "a", "b", "c", "d", "e")  # a repeated id
    second = _tasks("a", "b")  # fixes the id, too few tasks
    third = _tasks("a", "a", "b", "c", "d", "f")  # the repeated id is back
    good = _tasks("a", "b", "c", "d", "e", "f")
    server = ScriptedLLM([json_reply(first), json_reply(second), json_reply(third), json_reply(good)])
    with server.serve() as background:
        work = run_tasks_stage(
            EnvWork.start(SCENARIOS[0], 1), _generator(f"{background.url}/v1"), AttemptLog("memory"), 5
        )
    assert [t.id for t in work.tasks.tasks] == ["a", "b", "c", "d", "e", "f"]
    prompts = [_user(body) for body in server.requests]
    assert len(prompts) == 4 and "Attempt" not in prompts[0]
    third_prompt = prompts[2]
    for n, answer in ((1, first), (2, second)):  # each earlier answer whole, with its error
        assert f"=== Attempt {n}: rejected" in third_prompt
        assert all(json.dumps(task) in third_prompt for task in answer["tasks"])
    assert len(json.dumps(first)) > 4000 and "cut" not in third_prompt
    assert "repeated: a" in third_prompt and "got 2 tasks" in third_prompt
    assert "brought back" not in third_prompt
    fourth_prompt = prompts[3]
    assert "attempt 3 brought back the failure of attempt 1: duplicate_ids (a)" in fourth_prompt
    assert all(f"=== Attempt {n}: rejected" in fourth_prompt for n in (1, 2, 3))
    assert work.history["tasks"].attempts[-1].error == "" and len(work.history["tasks"].attempts) == 4


def test_answers_over_the_budget_keep_the_parts_their_failures_name_and_say_what_was_cut():
    body = "\n".join(f"    total += {i}" for i in range(400))
    module = "import json\n\n" + "\n\n".join(
        f"def tool_{n}(conn):\n    total = 0\n{body}\n    return total" for n in range(8)
    )
    history = StepHistory()
    for n in range(4):  # four attempts of about 30,000 characters each: over ANSWERS_CHARS together
        history.add(
            json.dumps({"tools_py": module}),
            f"tool_{n} crashed",
            faults=[Fault(kind="tool crashed", subject=f"tool_{n}")],
        )
    history.add(json.dumps({"tools_py": "def short(conn):\n    return 1\n"}), "short crashed")
    text = history.repair_text()
    assert len(module) * 4 > ANSWERS_CHARS and len(text) < ANSWERS_CHARS + 40_000
    assert "def short(conn):\n    return 1" in text  # a short answer whole
    oldest = text.split("=== Attempt 1: rejected")[1].split("=== Attempt 2")[0]
    assert "import json" in oldest and "def tool_0(conn):" in oldest and "def tool_5(conn):" not in oldest
    assert "[cut from this answer to fit the prompt (7 parts no failure names): tools_py: tool_1, tool_2" in oldest


def test_the_names_taken_are_the_catalogs_worlds_newest_first(tmp_path):
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    with catalog.session() as session:
        session.add(
            Environment(env_id="paws_1", scenario_name="Paws Palace", created_at=datetime(2026, 1, 1, tzinfo=UTC))
        )
        session.add(
            Environment(env_id="paws_2", scenario_name="Paws Palace", created_at=datetime(2026, 1, 2, tzinfo=UTC))
        )
        session.add(
            Environment(env_id="tutor_1", scenario_name="Tutor Town", created_at=datetime(2026, 1, 3, tzinfo=UTC))
        )
    assert catalog_names(catalog) == ["Tutor Town", "Paws Palace"] and catalog_names(None) == []
    assert taken_lines(["a", "b", "c"], limit=2) == "- a\n- b\n(and 1 more, not shown)"


def test_the_scenario_prompt_lists_the_names_taken():
    fresh = {
        "scenarios": [
            {"name": "Harbor Kennel Club", "description": "Owners book kennel stays.", "categories": ["pets"]}
        ]
    }
    server = ScriptedLLM([json_reply(fresh)])
    with server.serve() as background:
        accepted = expand_scenarios(
            SCENARIOS[:10], 1, _generator(f"{background.url}/v1"), AttemptLog("names"), taken=["Paws Palace"]
        )
    assert [s.name for s in accepted] == ["Harbor Kennel Club"]
    user = _user(server.requests[0])
    taken = user.split("These names are taken")[1].split("Propose")[0]
    assert "- Paws Palace" in taken and all(f"- {s.name}" in taken for s in SCENARIOS[:10])


@pytest.mark.sandbox
def test_the_schema_steps_conventions_reach_the_seed_tools_and_verifiers_prompts_and_the_bundle(runtime):
    server = ProceduralLLM(seed=2)
    with server.serve() as background:
        result = build_environment(SCENARIOS[3], 2, _generator(f"{background.url}/v1"), runtime, AttemptLog("conv"))
    assert result.good and result.bundle is not None
    conventions = result.bundle.manifest.conventions
    assert conventions is not None and "integer cents" in conventions.units and conventions.rules
    stated = conventions.lines()
    for stage in ("seed", "tool_plan", "tool_code", "verifiers"):
        (user,) = [_user(b) for (s, _), b in zip(server.served, server.requests, strict=True) if s == stage]
        assert stated in user.split("The world's conventions (follow them):")[1], stage
        if stage != "seed":  # the tools and verifiers see the seeded rows, each table with its next id
            assert "the next inserted row gets id" in user.split("Seed rows")[1], stage


def test_the_seed_excerpt_holds_the_rows_a_task_names_or_filters_on_beyond_the_first_rows():
    conn = sqlite3.connect(":memory:")
    conn.executescript(
        "CREATE TABLE walkers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, rate_cents INTEGER NOT NULL);"
        "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL);"
    )
    conn.executemany(
        "INSERT INTO walkers (name, rate_cents) VALUES (?, ?)", [(f"Walker {i}", 2000 + i) for i in range(150)]
    )
    conn.execute("UPDATE walkers SET name = 'Maria Lopez' WHERE id = 120")
    conn.executemany("INSERT INTO notes (body) VALUES (?)", [(f"note {i}",) for i in range(300)])
    world = conn.serialize()
    named = seed_view(world, [], limit=2000, texts=["Book a walk with Maria Lopez for Friday."])
    assert "(120, 'Maria Lopez', 2119)" in named  # unquoted, not an entity, the 120th row
    assert "(4, 'note 3')" not in named  # other tables: their first rows only
    cheapest = seed_view(world, [], limit=20_000, texts=["Which walker is the cheapest?"])
    assert "(150, 'Walker 149', 2149)" in cheapest and "(40, 'note 39')" not in cheapest
