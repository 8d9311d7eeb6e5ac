"""Behaviour probes of tools (quality/behaviour_probes.py): tools that run but do the wrong thing are each
found by the rule they break, named with the tool, and sent to the tool code; clean worlds (the golden
bundle, procedural worlds, the real-model worlds) raise no false alarm."""

from __future__ import annotations

import json

import pytest
from support.realmodel import real_world
from support.realmodel_faults import REAL_FAULTS

from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.faults import FAULTS, plant
from worldsmith.llm.procedural.faults_tools import TOOL_PLANTERS
from worldsmith.models.bundle import ToolSchema
from worldsmith.quality.behaviour_calls import Caller, SeedRows, rows_of
from worldsmith.quality.behaviour_probes import behaviour_probes
from worldsmith.quality.probe_results import Probe, ProbeFailure
from worldsmith.quality.range_bounds import bounds, documented
from worldsmith.quality.sql_injection import injection_probes, sql_from_arguments
from worldsmith.quality.world_values import world_values
from worldsmith.quality.written_units import shared_format, unit_factor, unit_or_format_changed
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step

pytestmark = pytest.mark.sandbox

#: Each planted tool fault class and the failure that must name its tool.
EXPECTED = {
    "read_ignores_status_filter": ProbeFailure.READ_ROW_OUTSIDE_FILTER,
    "write_sets_wrong_column": ProbeFailure.WRITE_WRONG_COLUMN,
    "cancel_leaves_dependents": ProbeFailure.DEPENDENT_ROWS_LEFT,
    "inclusive_end_treated_exclusive": ProbeFailure.RANGE_BOUNDARY_BROKEN,
    "fstring_sql_from_arguments": ProbeFailure.SQL_BUILT_FROM_ARGUMENTS,
    "filter_drops_matching_rows": ProbeFailure.READ_DROPPED_ROWS,
    "documented_unit_changed": ProbeFailure.WRITE_UNIT_CHANGED,
    "documented_format_changed": ProbeFailure.WRITE_FORMAT_CHANGED,
    "dependents_left_unlike_sibling": ProbeFailure.DEPENDENT_ROWS_LEFT,
}


def _tool(tool: str, **properties: dict[str, object]) -> ToolSchema:
    return ToolSchema.model_validate(
        {"name": tool, "description": "", "parameters": {"type": "object", "properties": properties}}
    )


# -- fast: the static check, the documented bounds, the rows of a value ----------------------------------


@pytest.mark.unit
def test_sql_formatted_from_a_text_argument_is_found_and_parameterized_sql_is_not():
    source = """
def _find(conn, table, text):
    return conn.execute(f"SELECT * FROM {table} WHERE name = '{text}'").fetchall()

def by_fstring(conn, name: str):
    q = name.strip().lower()
    return conn.execute(f"SELECT * FROM t WHERE name = '{q}'").fetchall()

def by_concat(conn, name: str):
    sql = "SELECT * FROM t WHERE name = '" + name + "'"
    return conn.execute(sql).fetchall()

def by_percent(conn, name: str):
    return conn.execute("SELECT * FROM t WHERE name = '%s'" % name).fetchall()

def by_format(conn, name: str):
    return conn.execute("SELECT * FROM t WHERE name = '{}'".format(name)).fetchall()

def by_helper(conn, name: str):
    return _find(conn, "t", name)

def parameterized(conn, name: str, status: str):
    changes = {"status": status}
    sql = f"UPDATE t SET {', '.join(k + ' = ?' for k in changes)} WHERE name = ?"
    conn.execute(sql, [*changes.values(), name])
    return _find(conn, "t", "fixed")

def enum_only(conn, kind: str):
    return conn.execute(f"SELECT * FROM t WHERE kind = '{kind}'").fetchall()
"""
    text = {"type": "string"}
    names = ["by_fstring", "by_concat", "by_percent", "by_format", "by_helper", "parameterized"]
    tools = [_tool(n, name=text, status=text) for n in names]
    tools.append(_tool("enum_only", kind={"type": "string", "enum": ["a", "b"]}))
    found = {f.tool: f for f in sql_from_arguments(source, tools)}
    assert set(found) == {"by_fstring", "by_concat", "by_percent", "by_format", "by_helper"}
    assert found["by_fstring"].parameter == "name" and found["by_fstring"].line == 7


@pytest.mark.unit
def test_documented_bounds_are_read_from_the_words_of_parameters_and_descriptions():
    assert documented("Only appointments starting on or before this date (YYYY-MM-DD), inclusive.") is True
    assert documented("End date, exclusive.") is False
    assert documented("The end date.") is None
    tool = ToolSchema.model_validate(
        {
            "name": "list_things",
            "description": "Things between two dates (inclusive).",
            "parameters": {
                "type": "object",
                "properties": {
                    "starts_on_to": {"type": "string", "description": "Last day (YYYY-MM-DD)."},
                    "from_date": {"type": "string", "description": "First day (YYYY-MM-DD)."},
                    "max_results": {"type": "integer", "description": "At most this many."},
                    "price_max": {"type": ["integer", "null"], "description": "At most this price, inclusive."},
                },
            },
        }
    )
    found = {b.parameter: (b.upper, b.inclusive, b.dates) for b in bounds(tool, {})}
    assert found == {
        "starts_on_to": (True, True, True),
        "from_date": (False, True, True),
        "price_max": (True, True, False),
    }


@pytest.mark.unit
def test_the_rows_a_value_lists():
    assert rows_of([{"id": 1}, {"id": 2}]) == [{"id": 1}, {"id": 2}]
    assert rows_of({"provider": {"id": 1}, "slots": [{"id": 3}]}) == [{"id": 3}]
    assert rows_of({"id": 1, "name": "x"}) is None
    assert rows_of({"a": [{"id": 1}], "b": [{"id": 2}]}) is None  # two lists: which one is not certain


@pytest.mark.unit
def test_a_value_stored_in_another_unit_or_format_is_named_and_the_same_value_is_not():
    assert unit_factor(125, 12500) == 100 and unit_factor(30, 0.5) == pytest.approx(1 / 60)
    assert unit_factor(31, 68.3) == pytest.approx(2.20462)  # kilograms stored as pounds, rounded
    assert unit_factor(125, 125) is None and unit_factor(125, 130) is None and unit_factor(True, 100) is None
    dates = ["2024-01-31", "2024-02-29"]
    assert shared_format(dates) == "YYYY-MM-DD" and shared_format(["2024-01-31", "soon"]) is None
    changed = unit_or_format_changed("pets", "birth_date", "2020-09-01", "09/01/2020", dates, "Birth date YYYY-MM-DD")
    assert changed is not None and changed[0] is ProbeFailure.WRITE_FORMAT_CHANGED and "09/01/2020" in changed[1]
    assert unit_or_format_changed("pets", "birth_date", "2020-09-01", "2020-09-01", dates, "") is None
    assert unit_or_format_changed("pets", "note", "a b", "A B", ["x y", "z w"], "") is None  # free text: no format
    scaled = unit_or_format_changed("items", "price_cents", 250, 25000, [100, 200], "Price in cents.")
    assert scaled is not None and scaled[0] is ProbeFailure.WRITE_UNIT_CHANGED
    assert "x100" in scaled[1] and "Price in cents." in scaled[1]


@pytest.mark.unit
def test_every_tool_fault_class_is_registered_with_the_bench():
    assert set(TOOL_PLANTERS) <= set(FAULTS) and set(EXPECTED) == set(TOOL_PLANTERS)


# -- each planted fault found, each clean world clean -----------------------------------------------------


@pytest.mark.parametrize("fault", list(EXPECTED))
def test_each_planted_tool_fault_is_found_by_its_rule_and_sent_to_the_tool_code(runtime, fault):
    planted = plant(procedural_bundle("retail", 1), fault)
    results = behaviour_probes(runtime, planted.bundle)
    failed = [r for r in results if not r.passed]
    assert [(r.target, r.failure) for r in failed] == [(next(iter(planted.targets)), EXPECTED[fault])], [
        r.detail for r in failed
    ]
    (result,) = failed
    assert owning_step(result) == (Stage.TOOLS, "code")
    assert result.detail and result.cause  # the input (or the line) and the rule, for the repair


def test_a_quote_that_ends_a_string_in_the_sql_is_found_by_injection_too(runtime):
    planted = plant(procedural_bundle("retail", 1), "fstring_sql_from_arguments")
    (tool,) = [t for t in planted.bundle.tools if t.name in planted.targets]
    with runtime.open_episode(planted.bundle) as episode:
        caller = Caller(episode, planted.bundle.world)
        found = injection_probes(caller, [tool], {tool.name: {"query": "a"}}, static={})
    assert [(r.target, r.failure) for r in found] == [(tool.name, ProbeFailure.SQL_INJECTION_ACCEPTED)]
    assert "OR 1=1" in found[0].detail


def test_clean_worlds_raise_no_false_alarm(runtime, golden):
    for bundle in (golden, procedural_bundle("clinic", 2), procedural_bundle("library", 1)):
        results = behaviour_probes(runtime, bundle)
        assert [r.detail for r in results if not r.passed] == [], bundle.env_id
        judged = {r.probe for r in results}
        assert {Probe.READ_FILTERS, Probe.WRITE_EFFECTS, Probe.NO_SQL_FROM_ARGUMENTS} <= judged
    assert json.dumps([r.record() for r in results])


def test_the_real_model_worlds_pass_and_their_defects_are_found(runtime):
    for name in ("zocdoc", "rover"):
        results = behaviour_probes(runtime, real_world(name))
        assert [r.detail for r in results if not r.passed] == [], name
    defects = {
        ProbeFailure.RANGE_BOUNDARY_BROKEN: (
            'sql += " AND substr(start_at, 1, 10) <= ?"',
            'sql += " AND substr(start_at, 1, 10) < ?"',
        ),
        ProbeFailure.DEPENDENT_ROWS_LEFT: (
            "conn.execute(\"UPDATE reminders SET status = 'cancelled' WHERE appointment_id = ? AND status = 'scheduled'\"",
            "(\"UPDATE reminders SET status = 'cancelled' WHERE appointment_id = ? AND status = 'scheduled'\"",
        ),
    }
    for failure, edit in defects.items():
        failed = [
            (r.target, r.failure) for r in behaviour_probes(runtime, real_world("zocdoc", edit=edit)) if not r.passed
        ]
        target = "list_appointments" if failure is ProbeFailure.RANGE_BOUNDARY_BROKEN else "cancel_appointment"
        assert failed == [(target, failure)]


@pytest.mark.parametrize("real", [f for f in REAL_FAULTS if f.fault in TOOL_PLANTERS], ids=lambda f: f.fault)
def test_the_new_tool_fault_classes_are_found_in_real_model_worlds(runtime, real):
    failed = [(r.target, r.failure) for r in behaviour_probes(runtime, real.bundle()) if not r.passed]
    assert failed == [(real.target, EXPECTED[real.fault])]


@pytest.mark.unit
def test_seed_rows_know_children_and_the_rows_tied_to_a_parent(golden):
    seed = SeedRows(world_values(golden.world, 8))
    parent = next(t for t in seed.tables if seed.children(t))
    child, column, parent_column = seed.children(parent)[0]
    row = next(r for r in seed.rows[parent] if seed.tied(parent, r))
    assert all(r[column] == row[parent_column] for r in seed.tied(parent, row)[child])
