"""Verifier mutation testing (quality/verifier_mutations.py, quality/verifier_ids.py) and the answer formats a
verifier must accept (agent/answer_variants.py): every planted verifier fault class
(llm/procedural/faults_verifiers.py) is found and routed to the verifiers stage with its failing end state,
and clean worlds pass. The real-model worlds (examples/realmodel) show their
known flaws: a "1:30 to 2:30 PM" answer rejected, verifiers accepting an extra booking."""

from __future__ import annotations

import pytest
from support.realmodel import real_world
from support.realmodel_faults import REAL_FAULTS

from worldsmith.agent.adversarial import answer_variant_failures
from worldsmith.agent.answer_variants import (
    answer_variants,
    clock_12h,
    clock_24h,
    numbers_in_words,
    plain_currency,
    ranges_12h,
    ranges_24h,
)
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.llm.procedural.faults import FAULTS, plant
from worldsmith.llm.procedural.faults_verifiers import VERIFIER_PLANTERS
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import DbDiff
from worldsmith.quality.probe_results import Probe, ProbeFailure
from worldsmith.quality.probes import task_probes
from worldsmith.quality.text_values import is_free_text, quoted, text_variants
from worldsmith.quality.verifier_ids import seed_id_results
from worldsmith.quality.verifier_mutations import equivalent, other_answer, singulars, verifier_mutations
from worldsmith.stages.order import Stage
from worldsmith.stages.routing import owning_step

#: What finds each planted verifier fault: a failure of verifier mutation testing, an answer variant the
#: verifier rejects, or the untouched probe (quality/probes.py); the domain varies: the planting is generic.
FOUND_BY = {
    "verifier_exact_log_compare": (ProbeFailure.REORDERED_REJECTED, "retail"),
    "verifier_case_sensitive_name": ("answer_variant", "banking"),
    "verifier_passes_wrong_entity": (ProbeFailure.WRONG_ENTITY_ACCEPTED, "travel"),
    "verifier_passes_half_done": (ProbeFailure.HALF_DONE_ACCEPTED, "education"),
    "verifier_hard_coded_id": (ProbeFailure.SEED_ID_HARD_CODED, "library"),
    "verifier_passes_untouched": (ProbeFailure.UNTOUCHED_ACCEPTED, "hr"),
    "verifier_passes_extra_insert": (ProbeFailure.EXTRA_SIDE_EFFECT_ACCEPTED, "events"),
    "verifier_exact_free_text": (ProbeFailure.TEXT_VARIANT_REJECTED, "retail"),
    "verifier_accepts_any_text": (ProbeFailure.OTHER_TEXT_ACCEPTED, "banking"),
}


# -- unit: answer formats, end-state comparison, static id check ----------------------------------


@pytest.mark.unit
def test_times_and_ranges_are_rewritten_on_both_clocks():
    answer = "His first slot is 2024-12-18 at 13:30 (1:30 PM), until 14:30."
    assert ranges_12h(answer) == "His first slot is 2024-12-18 at 1:30 to 2:30 PM."
    assert ranges_24h(answer) == "His first slot is 2024-12-18 at 13:30-14:30."
    assert clock_12h("the 10:00-11:00 slot") == "the 10:00 AM-11:00 AM slot"
    assert ranges_12h("from 11:30 to 12:30") == "from 11:30 AM to 12:30 PM"  # the meridiem differs: both said
    assert clock_24h("at 3:00 PM, reminder 9 am") == "at 15:00, reminder 09:00"
    assert clock_12h("starts 2024-08-15T08:00") == "starts 2024-08-15T08:00"  # a timestamp is left whole


@pytest.mark.unit
def test_counts_in_words_and_amounts_with_a_code_keep_everything_else():
    assert numbers_in_words("5 visits with 3 providers on 2024-09-01, APT-58213, 31 kg") == (
        "five visits with three providers on 2024-09-01, APT-58213, 31 kg"
    )
    assert plain_currency("Total $5,750.00, fee $24.20") == "Total 5750 USD, fee 24.20 USD"
    names = {name for name, _ in answer_variants("Booked 2 walks at 13:30 for $20.00 with Lena")}
    assert {"clock_12h", "numbers_in_words", "plain_currency", "lower_case"} <= names


@pytest.mark.unit
def test_another_tasks_answer_is_one_that_says_something_else():
    def task(id_: str, answer: str | None) -> TaskSpec:
        return TaskSpec(id=id_, instruction="x", verifier=f"verify_{id_}", solution=[], answer=answer)

    tasks = [task("a", "1"), task("b", "1"), task("c", "Dr. Liu, 3 visits"), task("d", None)]
    assert other_answer(tasks[0], tasks) == "Dr. Liu, 3 visits"  # b's answer says the same
    assert other_answer(tasks[3], tasks) is None  # an action task has no answer to swap


@pytest.mark.unit
def test_end_states_equal_up_to_inserted_ids_are_equivalent():
    def diff(*logged: tuple[int, int]) -> DbDiff:
        rows = [{"id": i, "row_id": r} for i, r in logged]
        return DbDiff.model_validate({"tables": {"audit_log": {"inserted": rows}}})

    assert equivalent(diff((6, 8), (7, 5)), diff((6, 5), (7, 8)))
    assert not equivalent(diff((6, 8), (7, 5)), diff((6, 8), (7, 8)))
    assert singulars("availability_slots") == ["availability_slot", "slot"] and singulars("categories") == ["category"]


@pytest.mark.unit
def test_a_row_id_only_this_seed_has_is_flagged_and_ids_the_task_names_are_not():
    clean = procedural_bundle("library", 1)
    assert all(r.passed for r in seed_id_results(clean))  # its ids are the ones its solutions pass
    planted = plant(clean, "verifier_hard_coded_id")
    failed = [r for r in seed_id_results(planted.bundle) if not r.passed]
    assert {r.target for r in failed} == planted.targets
    assert failed[0].failure is ProbeFailure.SEED_ID_HARD_CODED and "SQL id =" in failed[0].detail
    assert owning_step(failed[0]) == (Stage.VERIFIERS, None)


@pytest.mark.unit
def test_every_verifier_fault_class_is_planted_and_has_a_finder():
    assert set(FOUND_BY) == set(VERIFIER_PLANTERS) and set(VERIFIER_PLANTERS) <= set(FAULTS)
    bundle = procedural_bundle("clinic", 1)
    for fault in VERIFIER_PLANTERS:
        planted = plant(bundle, fault)
        assert planted.targets and planted.bundle.files["verifiers.py"] != bundle.files["verifiers.py"], fault


@pytest.mark.unit
def test_free_text_is_words_and_its_variants_read_the_same():
    assert is_free_text("Revised shipping address 74") and is_free_text("Scheduling conflict")
    assert not any(map(is_free_text, ["APT-58213", "2024-12-19", "2024-12-19 10:00", "a@b.com", "plus", 12]))
    assert text_variants("New address 68") == ["NEW ADDRESS 68", " New address 68 ", "New address 68."]
    assert text_variants("CALL ME.")[0] == "call me." and text_variants("CALL ME.")[2] == "CALL ME"
    assert quoted('with the reason "Scheduling conflict".', "Scheduling conflict")
    assert not quoted("with the reason Scheduling conflict.", "Scheduling conflict")


# -- sandbox: end states built by the runtime, judged by the verifier ----------------------------


@pytest.mark.sandbox
def test_a_clean_world_passes_every_mutation_of_every_kind(runtime):
    bundle = procedural_bundle("retail", 1)
    results = verifier_mutations(runtime, bundle)
    assert [r for r in results if not r.passed] == []
    kinds = {r.detail.split(":")[0] for r in results if r.probe != Probe.NO_SEED_IDS}
    assert {"half done", "wrong entity", "extra side effect", "calls reordered"} <= kinds
    assert {"free text written otherwise", "another entity's text"} <= kinds
    from_replays = verifier_mutations(runtime, bundle, task_probes(runtime, bundle)[1])  # references not run again
    assert [(r.probe, r.target, r.detail) for r in from_replays] == [(r.probe, r.target, r.detail) for r in results]
    assert not answer_variant_failures(runtime, procedural_bundle("retail", 1))


@pytest.mark.sandbox
@pytest.mark.parametrize("fault", list(FOUND_BY))
def test_each_planted_verifier_fault_is_found_and_sent_to_the_verifiers_stage(runtime, fault):
    found_by, domain = FOUND_BY[fault]
    planted = plant(procedural_bundle(domain, 2), fault)
    if found_by == "answer_variant":
        rejected = answer_variant_failures(runtime, planted.bundle)
        assert {p.task_id for p in rejected} == planted.targets and "lower_case" in {p.variant for p in rejected}
        return
    tasks, replays = task_probes(runtime, planted.bundle)  # the mutations start from their references' replays
    results = tasks if fault == "verifier_passes_untouched" else []
    results += verifier_mutations(runtime, planted.bundle, replays)
    named = [r for r in results if r.failure is found_by and r.target in planted.targets]
    assert named, [r for r in results if not r.passed]
    assert owning_step(named[0]) == (Stage.VERIFIERS, None)
    if found_by is not ProbeFailure.SEED_ID_HARD_CODED and fault != "verifier_passes_untouched":
        assert "the end state: calls: " in named[0].detail and "changes: " in named[0].detail  # for the repair


@pytest.mark.sandbox
def test_the_real_model_worlds_known_flaws_are_found(runtime):
    zocdoc, rover = real_world("zocdoc"), real_world("rover")
    rejected = {(p.task_id, p.variant) for p in answer_variant_failures(runtime, zocdoc)}
    assert ("check_provider_accepts_plan", "range_12h") in rejected  # "1:30 to 2:30 PM"
    for bundle, booking in ((zocdoc, "book_in_network_dermatologist"), (rover, "book_cheapest_walker_97214")):
        failed = {(r.failure, r.target) for r in verifier_mutations(runtime, bundle) if not r.passed}
        assert (ProbeFailure.EXTRA_SIDE_EFFECT_ACCEPTED, booking) in failed  # an extra booking accepted
        assert not {f for f, _ in failed} & {ProbeFailure.SEED_ID_HARD_CODED, ProbeFailure.REORDERED_REJECTED}


@pytest.mark.sandbox
@pytest.mark.parametrize("real", [f for f in REAL_FAULTS if f.fault in VERIFIER_PLANTERS], ids=lambda f: f.fault)
def test_the_free_text_classes_are_found_in_a_real_model_world(runtime, real):
    failed = {(r.failure, r.target) for r in verifier_mutations(runtime, real.bundle()) if not r.passed}
    assert (FOUND_BY[real.fault][0], real.target) in failed
    clean = {(r.failure, r.target) for r in verifier_mutations(runtime, real_world(real.world)) if not r.passed}
    assert not {f for f, _ in clean} & {ProbeFailure.TEXT_VARIANT_REJECTED, ProbeFailure.OTHER_TEXT_ACCEPTED}
