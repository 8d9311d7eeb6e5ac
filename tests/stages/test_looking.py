"""Stages that look at the world they build (stages/looking.py): read-only SQL over the seed, tool calls on a
throwaway copy of it, and the verifiers stage running its reference solution and seeing each call's result
and the end state's diff before it answers; the looks kept in the attempt's trace."""

from __future__ import annotations

import json

import pytest
from support.llm_server import ProceduralLLM, ScriptedLLM, json_reply, tool_calls_reply
from support.patience import MOMENTS_S
from support.procedural import procedural_work

from worldsmith.llm.looks import LookBudget, LookKind, LookRefused
from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.llm.recording import RecordingGenerator, ReplayGenerator
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.looking import WorldLookout
from worldsmith.stages.task_list import run_tasks_stage
from worldsmith.stages.tools import run_tools_stage
from worldsmith.stages.verifiers import bundle_before_verifiers, run_verifiers_stage, seeded_world
from worldsmith.stages.work import EnvWork
from worldsmith.storage.attempt_artifacts import LOOKS, attempt_artifacts
from worldsmith.storage.catalog import Catalog
from worldsmith.storage.objectstore import LocalStore

pytestmark = pytest.mark.sandbox

BUDGET = LookBudget(looks=4, chars=4000, rows=3)


def lookout(runtime, work) -> WorldLookout:
    world = seeded_world(work)
    return WorldLookout(world, BUDGET, runtime, bundle_before_verifiers(work, OpenAIGenerator(model="m"), world), True)


def test_the_sql_look_reads_bounded_rows_and_refuses_writes(runtime):
    work, _ = procedural_work(runtime)
    look = lookout(runtime, work)
    answer = look.answer(LookKind.QUERY_DATABASE, {"sql": "SELECT id, display_name FROM accounts ORDER BY id"})
    rows = answer.splitlines()
    assert rows[0] == "3 rows:" and json.loads(rows[1])["id"] == 1 and "more rows than 3" in rows[-1]
    commented = look.answer(LookKind.QUERY_DATABASE, {"sql": "-- the first account\nSELECT id FROM accounts LIMIT 1"})
    assert commented.splitlines()[0] == "1 rows:"
    writes = ("DELETE FROM accounts", "WITH a AS (SELECT 1) DELETE FROM accounts", "PRAGMA writable_schema=1")
    for write in (*writes, "SELECT 1; DELETE FROM accounts"):
        with pytest.raises(LookRefused, match="read-only"):
            look.answer(LookKind.QUERY_DATABASE, {"sql": write})
    assert "error: " in look.answer(LookKind.QUERY_DATABASE, {"sql": "SELECT nothing FROM nowhere"})


def test_a_tool_look_runs_on_a_throwaway_copy(runtime):
    work, _ = procedural_work(runtime)
    look = lookout(runtime, work)
    wanted = {"tool": "cancel_purchase", "arguments": {"purchase_id": 17}}
    called = json.loads(look.answer(LookKind.CALL_TOOL, wanted))
    assert called["status"] == "ok"
    again = json.loads(look.answer(LookKind.CALL_TOOL, wanted))  # a fresh copy: the purchase is not cancelled yet
    assert again["status"] == "ok"
    status = look.answer(LookKind.QUERY_DATABASE, {"sql": "SELECT status FROM purchases WHERE id = 17"})
    assert "cancelled" not in status  # the seed itself never changes
    with pytest.raises(LookRefused, match="no tool 'drop_everything'"):
        look.answer(LookKind.CALL_TOOL, {"tool": "drop_everything"})


def offered(request: dict) -> set[str]:
    return {tool["function"]["name"] for tool in request.get("tools", [])}


def test_the_tools_stage_looks_at_the_seed_then_at_the_tools_that_ran_and_tasks_at_a_built_world(runtime):
    """The tools stage offers SQL from its first prompt and, once an attempt's tools.py ran in the sandbox (here
    crashing), calls of those tools in the repair; the tasks stage offers nothing before a world exists and
    SQL and tool calls once an earlier round built one."""
    built, _ = procedural_work(runtime)
    server = ProceduralLLM(faults={"tool_code": ["tool_raises"]}, seed=2)
    with server.serve() as background:
        generator = OpenAIGenerator(model="m", base_url=f"{background.url}/v1", timeout_s=MOMENTS_S, retries=1)
        fresh_tools = built.model_copy(update={"tools_py": None, "tool_plan": None})
        run_tools_stage(fresh_tools, generator, runtime, AttemptLog("tools"), 3)
        plan, crashed, repaired = server.requests
        assert offered(plan) == offered(crashed) == {"query_database"}
        assert offered(repaired) == {"query_database", "call_tool"}
        run_tasks_stage(EnvWork.start(built.scenario, built.seed), generator, AttemptLog("tasks"), 1, None, runtime)
        run_tasks_stage(built, generator, AttemptLog("tasks"), 1, None, runtime)
    first_round, later_round = server.requests[3:]
    assert "tools" not in first_round and offered(later_round) == {"query_database", "call_tool"}


def stored_looks(catalog: Catalog, store: LocalStore, attempt_id: int | None) -> list[dict]:
    with catalog.session() as session:
        stored = {a.name: a for a in attempt_artifacts(session, store, attempt_id)}
    return json.loads(stored[LOOKS].text)


def test_the_verifiers_stage_sees_its_reference_solutions_results_and_replays_them(runtime, tmp_path):
    """The model runs a reference solution before answering: each call's result and the end state's diff come
    back; the look is kept in the attempt's trace; `replay:DIR` of the recording gives the same looks back."""
    work, verifiers = procedural_work(runtime)
    solution = next(s for s in verifiers["solutions"] if s["task_id"] == "t03_update")
    server = ScriptedLLM(
        [
            tool_calls_reply(("run_solution", {"steps": solution["solution"]})),
            json_reply(verifiers),
        ]
    )
    catalog, store = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}"), LocalStore(tmp_path / "store")
    with server.serve() as background:
        generator = OpenAIGenerator(model="m", base_url=f"{background.url}/v1", timeout_s=MOMENTS_S, retries=1)
        log = AttemptLog("looking", catalog, store)
        done = run_verifiers_stage(work, RecordingGenerator(generator, tmp_path / "night"), runtime, log, 2)
    [attempt] = log.attempts
    assert attempt.outcome == "success"
    offered = {tool["function"]["name"] for tool in server.requests[0]["tools"]}
    assert offered == {"query_database", "call_tool", "run_solution"}
    seen = server.requests[1]["messages"][-1]
    assert seen["role"] == "tool"
    lines = seen["content"].splitlines()
    assert lines[0].startswith("call 1 get_purchase(") and '"status":"ok"' in lines[0]
    assert lines[1].startswith("call 2 update_purchase_shipping_address(")
    assert lines[-1].startswith("end state's diff from the seed: ") and '"purchases"' in lines[-1]
    [kept] = stored_looks(catalog, store, attempt.id)
    assert kept["kind"] == "run_solution" and kept["answer"] == seen["content"]

    replay_log = AttemptLog("replayed", catalog, store)
    again = run_verifiers_stage(work, ReplayGenerator(tmp_path / "night"), runtime, replay_log, 2)
    [replayed] = replay_log.attempts
    assert again.verifiers == done.verifiers and replayed.outcome == "success"
    assert stored_looks(catalog, store, replayed.id) == [kept]
    assert len(server.requests) == 2  # the replay asked nobody
