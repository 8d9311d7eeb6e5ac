"""Deep tool probes and blocked-task detection (quality/deep_probes.py): every planted fault class is
found and named, clean worlds pass, the same defects come out twice, the calls stay bounded, and an
imported world whose route crashes only for some valid ids is published as failed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.paths import TESTS

from worldsmith.agent.adversarial import answer_variant_failures
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.faults import FAULTS, plant
from worldsmith.llm.procedural.faults_verifiers import VERIFIER_PLANTERS
from worldsmith.quality.deep_probes import deep_probes
from worldsmith.quality.probe_results import Probe
from worldsmith.quality.probes import check_environment, probe_tools
from worldsmith.runtime.episode import SandboxEpisode
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step

pytestmark = pytest.mark.sandbox

SAMPLE = TESTS / "data" / "awm_format_sample"
#: The probe that must name each planted fault (the domain varies: the planting is generic).
FOUND_BY = {
    "crash_on_some_inputs": (Probe.VALID_INPUTS, "clinic"),
    "read_tool_writes": (Probe.READ_ONLY, "banking"),
    "writes_outside_tables": (Probe.OWN_TABLES, "events"),
    "blocked_task_missing_entity": (Probe.TASK_NOT_BLOCKED, "library"),
    "blocked_task_refused_step": (Probe.TASK_NOT_BLOCKED, "hr"),
    "wall_clock_read": (Probe.REPLAY_DETERMINISTIC, "retail"),
    "over_strict_answer_check": ("answer_variant", "hr"),  # the verifiers stage's answer-variant probes
    "seed_breaks_invariant": (Probe.SEED_INVARIANTS, "education"),  # quality/invariants.py
    # tools that run but do the wrong thing (faults_tools.py; tests/quality/test_tool_behaviour.py)
    "read_ignores_status_filter": (Probe.READ_FILTERS, "streaming"),
    "write_sets_wrong_column": (Probe.WRITE_EFFECTS, "messaging"),
    "cancel_leaves_dependents": (Probe.DEPENDENT_ROWS, "library"),
    "inclusive_end_treated_exclusive": (Probe.RANGE_BOUNDARIES, "events"),
    "fstring_sql_from_arguments": (Probe.NO_SQL_FROM_ARGUMENTS, "hr"),
    "filter_drops_matching_rows": (Probe.READ_FILTERS, "clinic"),
    "documented_unit_changed": (Probe.WRITE_EFFECTS, "food_delivery"),
    "documented_format_changed": (Probe.WRITE_EFFECTS, "events"),
    "dependents_left_unlike_sibling": (Probe.DEPENDENT_ROWS, "travel"),
}


@pytest.fixture(autouse=True)
def _full_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests hold the deep probes' default (full) budget to what it finds and costs."""
    from worldsmith.settings import get_settings

    monkeypatch.setenv("WORLDSMITH_DEEP_PROBE_BUDGET", "full")
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


@pytest.mark.unit
def test_every_fault_class_has_a_probe_that_finds_it():
    assert set(FOUND_BY) == set(FAULTS) - set(VERIFIER_PLANTERS)  # those: tests/quality/test_verifier_mutations.py


@pytest.mark.parametrize("fault", list(FOUND_BY))
def test_each_planted_fault_fails_the_probe_that_names_it(runtime, fault):
    probe, domain = FOUND_BY[fault]
    planted = plant(procedural_bundle(domain, 2), fault)
    if probe == "answer_variant":  # a verifier's false negatives: the reference's end state, reworded answers
        rejected = answer_variant_failures(runtime, planted.bundle)
        assert rejected and {p.task_id for p in rejected} == planted.targets, rejected
        assert not answer_variant_failures(runtime, procedural_bundle(domain, 2))  # the clean world's check
        return
    failed = [r for r in check_environment(runtime, planted.bundle) if not r.passed]
    named = [r for r in failed if r.probe == probe and r.target in planted.targets]
    assert named, failed
    if probe in (Probe.VALID_INPUTS, Probe.READ_ONLY, Probe.OWN_TABLES):  # the tool code's to fix
        assert owning_step(named[0]) == (Stage.TOOLS, "code")
        assert "first {" in named[0].detail  # the arguments that showed it
    if fault == "crash_on_some_inputs":  # one call per tool did not find it: it runs for most ids
        assert not any(r.probe == Probe.TOOL_RUNS for r in failed), failed
        assert "no_such_column" in named[0].detail


def test_clean_worlds_pass_every_deep_probe(runtime, golden):
    for bundle in (golden, procedural_bundle("banking", 3), procedural_bundle("support_desk", 3)):
        results = deep_probes(runtime, bundle)
        assert [r for r in results if not r.passed] == [], bundle.env_id
        assert {r.target for r in results if r.probe == Probe.VALID_INPUTS} == {t.name for t in bundle.tools}
        assert {r.target for r in results if r.probe == Probe.TASK_NOT_BLOCKED} == {t.id for t in bundle.tasks}


def test_the_deep_probes_find_the_same_defects_twice(runtime):
    planted = plant(procedural_bundle("clinic", 3), "crash_on_some_inputs").bundle
    first, second = deep_probes(runtime, planted), deep_probes(runtime, planted)
    assert [r for r in first if not r.passed] and first == second


def _counting_sandbox_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """A counter (one cell) of the calls every episode request carries to the sandbox from now on: a
    tool call, a snapshot, a restore, a verification; a batch counts each of its calls."""
    made = [0]
    request = SandboxEpisode._request

    def counted(self, *args, calls: int = 1, **kwargs):
        made[0] += calls
        return request(self, *args, calls=calls, **kwargs)

    monkeypatch.setattr(SandboxEpisode, "_request", counted)
    return made


def test_deep_probes_cost_a_bounded_multiple_of_one_call_per_tool(runtime, monkeypatch):
    """Measured in sandbox calls, the work itself: the same on any machine, however busy."""
    bundle = procedural_bundle("gaming", 2)
    made = _counting_sandbox_calls(monkeypatch)
    probe_tools(runtime, bundle)
    one_call, made[0] = made[0], 0
    deep_probes(runtime, bundle)
    deep = made[0]
    # about 30 sandbox calls per tool: its calls, and the restores of the pristine database they need
    assert one_call >= len(bundle.tools) and deep < 100 * one_call, (deep, one_call)


def _crash_for_some_ids(directory: Path) -> None:
    """The sample's `get_book` route answers HTTP 500 for every fourth book id (its example id, 6, works)."""
    path = directory / "gen_envs.jsonl"
    row = json.loads(path.read_text().splitlines()[0])
    head = 'async def get_book(book_id: int = Path(..., description="Book identifier", examples=[6])):\n'
    assert head in row["full_code"]
    row["full_code"] = row["full_code"].replace(
        head,
        head
        + "    if book_id % 4 == 0:\n        raise HTTPException(status_code=500, detail='internal server error')\n",
        1,
    )
    path.write_text(json.dumps(row) + "\n")


def test_an_imported_route_crashing_for_some_valid_ids_is_a_defect(runtime, tmp_path):
    from worldsmith.interop.catalog_import import import_release
    from worldsmith.storage.catalog import Catalog
    from worldsmith.storage.objectstore import LocalStore

    release = tmp_path / "release"
    shutil.copytree(SAMPLE, release)
    _crash_for_some_ids(release)
    catalog = Catalog(f"sqlite:///{tmp_path / 'catalog.db'}")
    (row,) = import_release(release, runtime, LocalStore(tmp_path / "store"), catalog)
    assert row["status"] == "failed", row
    assert {d["target"] for d in row["defects"]} == {"get_book"}, row["defects"]
    assert any("internal server error" in d["detail"] for d in row["defects"]), row["defects"]


# -- malformed inputs are never valid ones (issue 33, point 6) ---------------------------------------------

DATE_PARAMETERS = [
    {"type": "string", "description": "The day, as YYYY-MM-DD."},
    {"type": "string", "format": "date", "description": "The day."},
    {"type": "string", "description": "The day, an ISO 8601 date."},
]


@pytest.mark.unit
@pytest.mark.parametrize("schema", DATE_PARAMETERS, ids=["described", "format", "iso"])
def test_a_date_parameter_is_probed_only_with_dates(golden, schema):
    from datetime import date

    from worldsmith.quality.probes import SeedValues, sample_arguments
    from worldsmith.quality.tool_inputs import parameter_values
    from worldsmith.quality.world_values import WorldValues

    tool = {"name": "orders_on", "parameters": {"type": "object", "properties": {"day": schema}, "required": ["day"]}}
    drawn = sample_arguments(tool, SeedValues(golden.world))["day"]
    valid = parameter_values("day", schema, WorldValues(golden.world, 8), {"orders"}, []).valid
    for value in [drawn, *valid]:
        assert isinstance(value, str) and date.fromisoformat(value) and len(value) == 10, value
    assert valid


@pytest.mark.unit
def test_a_string_without_a_declared_format_keeps_its_values(golden):
    from worldsmith.quality.tool_inputs import parameter_values
    from worldsmith.quality.world_values import WorldValues

    schema = {"type": "string", "description": "Words to look for in product names."}
    assert len(parameter_values("query", schema, WorldValues(golden.world, 8), {"products"}, []).valid) > 1


@pytest.mark.unit
def test_world_values_are_built_once_per_world_and_bound(golden):
    from worldsmith.quality.world_values import WorldValues, forget_world_values, world_values

    forget_world_values()
    first = world_values(golden.world, 8)
    assert world_values(golden.world, 8) is first  # every probe family of a check reads the same one
    assert world_values(golden.world, 4) is not first and world_values(golden.world, 4).bound == 4
    assert first.columns == WorldValues(golden.world, 8).columns
    forget_world_values()
    assert world_values(golden.world, 8) is not first
