"""A world's invariants (bundle/invariants.py, quality/invariants.py): stated with the schema, the seed is
checked against them as soon as it is built (a broken one is a repair of the seed naming the invariant and
its rows), validation checks the seed and every reference solution's end state (a tool call that breaks
one goes to the tools' code); the invariants' SQL runs read-only and bounded; the procedural domains state
true ones; bundles without invariants stay valid."""

from __future__ import annotations

import re

import pytest
from support.llm_server import ScriptedLLM, json_reply
from support.patience import MOMENTS_S
from support.zocdoc import SLOT_INVARIANTS, zocdoc_bundle, zocdoc_sources

from worldsmith.bundle import invariants as invariant_sql
from worldsmith.bundle.invariants import MAX_ROWS, broken_invariants, invariant_problems
from worldsmith.bundle.loader import load_bundle, write_bundle
from worldsmith.bundle.sqlscript import SqlBudget
from worldsmith.llm.openai_backend import OpenAIGenerator
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.models.bundle import Invariant, Scenario
from worldsmith.models.quality import QualityCheck
from worldsmith.quality.checks import PROBES_CHECK
from worldsmith.quality.invariants import invariant_probes, seed_invariant_probes
from worldsmith.quality.probe_results import Probe, ProbeFailure
from worldsmith.quality.probes import task_probes
from worldsmith.stages.attempts import AttemptLog
from worldsmith.stages.database import run_database_stage
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step
from worldsmith.stages.validate import _route
from worldsmith.stages.work import EnvWork

SLOT_20 = re.compile(r"(VALUES \(20, [^\n]*)'booked'\);")


def _slot_20_open(seed_sql: str) -> str:
    """`seed_sql` with slot 20 marked open, though its confirmed appointment (APT 10) books it."""
    planted, count = SLOT_20.subn(r"\1'open');", seed_sql)
    assert count == 1
    return planted


@pytest.mark.sandbox
def test_the_written_world_keeps_its_slot_invariants_and_a_planted_open_slot_is_named_with_its_rows(runtime):
    assert broken_invariants(zocdoc_bundle().world, SLOT_INVARIANTS) == []
    sources = zocdoc_sources()
    sources["seed.sql"] = _slot_20_open(sources["seed.sql"])
    planted = zocdoc_bundle(sources)
    (violation,) = broken_invariants(planted.world, planted.invariants)
    assert violation.invariant.id == "open_slot_has_no_active_appointment" and violation.error is None
    assert len(violation.rows) == 1 and violation.rows[0].startswith("slot_id=20, confirmation_code=")
    # validation: the seed's probe fails, typed, and the route sends it to the seed step with the rows
    results = seed_invariant_probes(runtime, planted)
    failed = [r for r in results if not r.passed]
    assert [(r.failure, r.target) for r in failed] == [
        (ProbeFailure.SEED_BREAKS_INVARIANT, "open_slot_has_no_active_appointment")
    ]
    assert owning_step(failed[0]) == (Stage.DATABASE, "seed")
    check = QualityCheck(PROBES_CHECK, False, {"failed": 1}, [r.record() for r in failed])
    stage, step, error = _route([check]) or (None, None, "")
    assert (stage, step) == (Stage.DATABASE, "seed") and "slot_id=20" in error


@pytest.mark.unit
def test_every_procedural_domain_states_invariants_its_seed_keeps_and_bundles_carry_them(tmp_path, golden):
    for domain in DOMAINS:
        bundle = procedural_bundle(domain.key, 2)
        assert len(bundle.invariants) >= 3, domain.key
        assert broken_invariants(bundle.world, bundle.invariants) == [], domain.key
    reloaded = load_bundle(write_bundle(bundle, tmp_path / "world"))
    assert reloaded.invariants == bundle.invariants and "invariants.json" in reloaded.manifest.artifacts
    assert golden.invariants == () and "invariants.json" not in golden.files  # bundles without it stay valid


@pytest.mark.unit
def test_invariant_sql_is_one_select_run_read_only_with_its_rows_and_time_bounded(monkeypatch):
    def stated(sql: str) -> Invariant:
        return Invariant(id="rule", statement="a rule of the world", sql=sql)

    assert invariant_problems([stated("SELECT id FROM availability_slots")]) == []
    for sql in ("DELETE FROM appointments", "SELECT 1; DELETE FROM appointments", "PRAGMA writable_schema = 1"):
        assert invariant_problems([stated(sql)]), sql
    world = zocdoc_bundle().world
    (denied,) = broken_invariants(world, [stated("SELECT load_extension('/tmp/x.so') AS loaded")])
    assert denied.error is not None and "not authorized" in denied.error
    (many,) = broken_invariants(world, [stated("SELECT id FROM availability_slots")])
    assert len(many.rows) == MAX_ROWS and many.more
    monkeypatch.setattr(invariant_sql, "INVARIANT_BUDGET", SqlBudget(statement_s=0.2, total_s=1.0))
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n WHERE x < 0"
    (stopped,) = broken_invariants(world, [stated(endless)])
    assert stopped.error is not None and "ran out of its time" in stopped.error
    assert broken_invariants(world, [stated("SELECT id FROM patients WHERE 0")]) == []  # the world untouched


def _generator(url: str) -> OpenAIGenerator:
    return OpenAIGenerator(model="m", base_url=url, timeout_s=MOMENTS_S, retries=1)


@pytest.mark.unit
def test_the_database_stage_states_invariants_and_repairs_a_seed_that_breaks_one():
    sources = zocdoc_sources()
    unknown = Invariant(id="ghost_rule", statement="no ghost has a slot", sql="SELECT id FROM ghosts")
    stated = [i.model_dump() for i in SLOT_INVARIANTS]
    server = ScriptedLLM(
        [
            json_reply({"schema_sql": sources["schema.sql"], "invariants": [*stated, unknown.model_dump()]}),
            json_reply({"schema_sql": sources["schema.sql"], "invariants": stated}),
            json_reply({"seed_sql": _slot_20_open(sources["seed.sql"])}),
            json_reply({"seed_sql": sources["seed.sql"]}),
        ]
    )
    work = EnvWork.start(Scenario(name="Zocdoc", description="Patients book doctors in open slots."), 3)
    with server.serve() as background:
        log = AttemptLog("invariants")
        done = run_database_stage(work, _generator(f"{background.url}/v1"), log, 3)
    assert [(a.stage, a.outcome, a.error_class) for a in log.attempts] == [
        ("database:schema", "failure", "invariant_sql_error"),
        ("database:schema", "success", None),
        ("database:seed", "failure", "invariant_broken"),
        ("database:seed", "success", None),
    ]
    assert done.invariants == SLOT_INVARIANTS and done.seed_sql == sources["seed.sql"]
    first_seed, repair = (r["messages"][1]["content"] for r in server.requests[2:4])
    assert "a slot marked open has no appointment that is not cancelled" in first_seed  # the seed sees them
    assert "open_slot_has_no_active_appointment" in repair and "slot_id=20" in repair
    assert "ghost_rule" in log.attempts[0].error_text and "ghosts" in log.attempts[0].error_text


@pytest.mark.sandbox
def test_a_tool_that_breaks_an_invariant_is_found_at_its_step_and_sent_to_the_tools_code(runtime):
    clean = invariant_probes(runtime, zocdoc_bundle())
    assert clean and all(r.passed for r in clean), [r for r in clean if not r.passed]
    assert {r.target for r in clean if r.probe == Probe.END_STATE_INVARIANTS} == {
        t.id for t in zocdoc_bundle().tasks if t.solution
    }
    sources = zocdoc_sources()
    marks_booked = '    conn.execute("UPDATE availability_slots SET status = \'booked\' WHERE id = ?", (s["id"],))\n'
    assert sources["tools.py"].count(marks_booked) == 3
    sources["tools.py"] = sources["tools.py"].replace(marks_booked, "", 1)  # book_appointment leaves it open
    broken = zocdoc_bundle(sources)
    _, replays = task_probes(runtime, broken)  # the steps run here, or their databases as probe_tasks kept them
    for failed in (
        [r for r in invariant_probes(runtime, broken) if not r.passed],
        [r for r in invariant_probes(runtime, broken, replays) if not r.passed],
    ):
        assert [(r.failure, r.target, r.cause) for r in failed] == [
            (ProbeFailure.TOOL_BREAKS_INVARIANT, "book_in_network_dermatologist", "step 4 (book_appointment)")
        ]
        assert "open_slot_has_no_active_appointment" in failed[0].detail and "slot_id=8" in failed[0].detail
        assert owning_step(failed[0]) == (Stage.TOOLS, "code")


@pytest.mark.sandbox
@pytest.mark.parametrize("domain", ["clinic", "logistics"])
def test_the_procedural_worlds_end_states_keep_their_invariants(runtime, domain):
    bundle = procedural_bundle(domain, 2)
    results = invariant_probes(runtime, bundle)
    assert [r for r in results if not r.passed] == []
    assert {r.target for r in results if r.probe == Probe.END_STATE_INVARIANTS} == {
        t.id for t in bundle.tasks if t.solution
    }


@pytest.mark.sandbox
def test_invariant_queries_of_an_episode_run_read_only_and_bounded_in_its_worker(runtime):
    bundle = zocdoc_bundle()
    endless = "WITH RECURSIVE n(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM n) SELECT x FROM n WHERE x < 0"
    with runtime.open_episode(bundle) as episode:
        before = episode.snapshot()
        deleted, stopped, some = episode.query(
            ["DELETE FROM appointments", endless, "SELECT id FROM availability_slots ORDER BY id"], 3, 0.2, 2.0
        )
        assert episode.snapshot() == before
    assert deleted["error"] is not None and "not authorized" in deleted["error"]
    assert stopped["error"] is not None and "ran out of its time" in stopped["error"]
    assert some == {"rows": [{"id": 1}, {"id": 2}, {"id": 3}], "more": True, "error": None}
