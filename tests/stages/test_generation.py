"""The generation pipeline without Prefect: procedural worlds, stages and their repair loops."""

from __future__ import annotations

import datetime
from collections import Counter

import pytest

from worldsmith.llm.procedural.backend import ProceduralGenerator, procedural_bundle, world_for
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.llm.procedural.compose import compose
from worldsmith.llm.procedural.mapping import domain_for
from worldsmith.models.bundle import Scenario
from worldsmith.quality.probes import check_environment
from worldsmith.stages.attempts import AttemptLog, stage_summary
from worldsmith.stages.pipeline import build_environment
from worldsmith.stages.scenario import DEFAULT_SCENARIOS, expand_scenarios, load_scenarios, novel

pytestmark = pytest.mark.unit

SEEDS = load_scenarios(DEFAULT_SCENARIOS)


def draft_bundle(domain, seed):
    return procedural_bundle(domain.key, seed)


def test_every_seed_scenario_maps_to_one_of_at_least_twelve_domains():
    assert len(DOMAINS) >= 12
    counts = Counter(domain_for(s).key for s in SEEDS)
    assert sum(counts.values()) == 100 and len(counts) >= 12
    assert domain_for(next(s for s in SEEDS if s.name == "Airbnb")).key == "travel"
    assert domain_for(next(s for s in SEEDS if s.name == "Chase")).key == "banking"


@pytest.mark.parametrize("domain", DOMAINS, ids=[d.key for d in DOMAINS])
def test_every_domain_composes_a_valid_world_of_the_right_size(domain):
    bundle = draft_bundle(domain, seed=11)
    stats = bundle.manifest.stats
    assert 5 <= stats["tables"] <= 20 and 15 <= stats["tools"] <= 40 and stats["tasks"] == 10
    assert compose(domain, 11).seed_sql == compose(domain, 11).seed_sql  # deterministic
    assert compose(domain, 11).seed_sql != compose(domain, 12).seed_sql


@pytest.mark.sandbox
@pytest.mark.parametrize("key", ["retail", "clinic", "events"])
def test_composed_worlds_pass_every_probe(runtime, key):
    domain = next(d for d in DOMAINS if d.key == key)
    failures = [r for r in check_environment(runtime, draft_bundle(domain, seed=3)) if not r.passed]
    assert failures == []


@pytest.mark.sandbox
def test_pipeline_repairs_every_kind_of_fault(runtime):
    log = AttemptLog("test-run")
    generator = ProceduralGenerator(seed=4, fault_rate=1.0)  # every stage's first attempt fails
    result = build_environment(SEEDS[0], 4, generator, runtime, log)
    assert result.good and result.bundle.manifest.generator.backend == "procedural"
    failures = {(a.stage, a.error_class) for a in log.attempts if a.outcome == "failure"}
    assert ("tasks", "truncated") in failures  # JSON cut off mid-way
    assert ("database:schema", "sql_error") in failures
    assert ("database:seed", "seed_error") in failures  # a row breaking a foreign key
    assert ("tools:code", "tool_crash") in failures
    assert ("verifiers", "verifier_accepts_untouched") in failures
    seed_error = next(a for a in log.attempts if a.error_class == "seed_error")
    assert "FOREIGN KEY constraint failed" in seed_error.error_text and "9999 has no match" in seed_error.error_text
    summary = {row["stage"]: row for row in stage_summary(log.attempts)}
    assert summary["database:seed"]["repair_rate"] == 1.0 and summary["database:seed"]["mean_attempts"] == 2.0
    assert summary["validate"]["first_attempt_success"] == 1.0


@pytest.mark.sandbox
def test_without_faults_every_stage_succeeds_first_time(runtime):
    log = AttemptLog("clean")
    result = build_environment(SEEDS[2], 9, ProceduralGenerator(seed=9), runtime, log)
    assert result.good
    assert all(a.outcome == "success" and a.attempt == 1 for a in log.attempts)


@pytest.mark.sandbox
def test_stage_out_of_attempts_fails_the_environment(runtime):
    log = AttemptLog("strict")
    result = build_environment(SEEDS[3], 5, ProceduralGenerator(seed=5, fault_rate=1.0), runtime, log, max_attempts=1)
    assert not result.good and result.bundle is None
    assert result.failed_stage == "tasks" and "failed after 1 attempts" in result.reason


def test_scenarios_expand_without_near_duplicates():
    log = AttemptLog("scenarios")
    scenarios = expand_scenarios(SEEDS, 20, ProceduralGenerator(seed=2), log)
    assert len(scenarios) == 20 and len({s.name for s in scenarios}) == 20
    assert novel(scenarios, SEEDS)[0] == scenarios  # none is a near-duplicate of a seed or another
    categories = Counter(s.categories[0] for s in scenarios)
    assert max(categories.values()) - min(categories.values()) <= 1  # kept balanced
    copy = SEEDS[0].model_copy(update={"name": "Amazon Marketplace"})
    accepted, dropped = novel([copy], SEEDS)
    assert accepted == [] and "near-duplicate of 'Amazon'" in dropped[0]


def test_a_scenario_built_twice_from_one_seed_gives_the_same_world():
    assert world_for(SEEDS[5], 1).tools_py == world_for(SEEDS[5], 1).tools_py


def _tables(world) -> set[str]:
    return {e.table for e in world.domain.entities}


@pytest.mark.sandbox
def test_scenarios_of_one_domain_get_different_worlds_that_all_validate(runtime):
    stores = [
        Scenario(name=f"{company} Online store", description="An online store.", categories=["retail"])
        for company in ("Acme", "Globex", "Initech")
    ]
    worlds = [world_for(s, 20261101) for s in stores] + [world_for(stores[0], 20261102)]
    assert {w.domain.key for w in worlds} == {"retail"}
    assert len({w.schema_sql for w in worlds}) == len(worlds)  # no two byte-identical
    assert len({frozenset(w.tool_names) for w in worlds}) > 1 and len({len(w.tool_names) for w in worlds}) > 1
    assert len({frozenset(_tables(w)) for w in worlds}) > 1
    columns = [{(e.table, f.name) for e in w.domain.entities for f in e.fields} for w in worlds]
    assert len({frozenset(c) for c in columns}) == len(worlds)
    mixes = {tuple(sorted(t.solution[-1].tool.split("_")[0] for t in w.tasks)) for w in worlds}
    assert len(mixes) > 1  # the task mix follows the tools a world has
    for scenario, seed in ((stores[1], 20261101), (stores[0], 20261102)):  # the pipeline's checks pass
        result = build_environment(scenario, seed, ProceduralGenerator(seed=seed), runtime, AttemptLog("variety"))
        assert result.good, result.reason
        assert result.bundle.manifest.stats["tools"] == len(world_for(scenario, seed).tool_names)


def test_nights_spread_their_scenarios_over_different_domains():
    nights = [
        expand_scenarios(SEEDS, 8, ProceduralGenerator(seed=night), AttemptLog(str(night)))
        for night in (20261101, 20261102)
    ]
    picked = [{domain_for(s).key for s in scenarios} for scenarios in nights]
    assert all(len(domains) == 8 for domains in picked)  # one scenario per domain while domains last
    assert picked[0] != picked[1]


def test_categories_are_kept_balanced_when_there_are_more_candidates():
    from worldsmith.stages.scenario import balanced

    def make(name, category):
        return Scenario(name=name, description=f"{name} does {category} things", categories=[category])

    candidates = [
        make("A1", "retail"),
        make("A2", "retail"),
        make("A3", "retail"),
        make("B1", "travel"),
        make("C1", "banking"),
    ]
    assert [s.name for s in balanced(candidates, [make("X", "retail")], 3)] == ["B1", "C1", "A1"]


@pytest.mark.sandbox
def test_the_tools_stage_calls_tools_under_the_worlds_clock(runtime):
    """The tools stage's probes run the tools as the world's episodes will: under its clock."""
    from worldsmith.stages.tools import tools_only_bundle
    from worldsmith.stages.work import EnvWork

    work = EnvWork.start(Scenario(name="clock shop", description="A shop that dates its orders."), 3)
    work = work.model_copy(
        update={"schema_sql": "CREATE TABLE t (id INTEGER PRIMARY KEY);", "seed_sql": "INSERT INTO t VALUES (1);"}
    )
    source = "import datetime\n\n\ndef today(conn):\n    return datetime.datetime.now().isoformat()\n"
    schema = {"name": "today", "description": "today's date", "parameters": {"type": "object", "properties": {}}}
    with runtime.open_episode(tools_only_bundle(work, source, [schema])) as episode:
        assert episode.call_tool("today").value[:10] == work.now[:10] != datetime.date.today().isoformat()
