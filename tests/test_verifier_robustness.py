"""Adversarial trajectories against the golden bundle and procedural worlds; the side-effect guard."""

from __future__ import annotations

import pytest

from worldsmith.agent.adversarial import probes_for, rates, run_probes
from worldsmith.agent.footprint import Footprint
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import ScriptPolicy
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.results import DbDiff


def test_golden_bundle_has_no_false_positive_or_negative(runtime, golden):
    probes = run_probes(runtime, golden)
    report = rates(probes)
    assert report["false_positives"] == [] and report["false_negatives"] == []
    kinds = {p.kind for p in probes}
    assert kinds == {"reference", "nothing", "claim", "wrong_entity", "side_effect", "half"}
    halves = {p.task_id: p.verdict for p in probes if p.kind == "half"}
    assert halves["t03_cancel_and_readdress"] == "partial" and len(halves) >= 5  # every multi-change task has a half


@pytest.mark.parametrize("domain", ["retail", "clinic", "banking"])
def test_procedural_worlds_have_no_false_positive_or_negative(runtime, domain):
    report = rates(run_probes(runtime, procedural_bundle(domain, 5)))
    assert report["false_positive_rate"] == 0.0 and report["false_negative_rate"] == 0.0, report
    assert report["by_kind"]["side_effect"]["n"] == 10 and report["by_kind"]["half"]["verdicts"] == {
        "partial": report["by_kind"]["half"]["n"]
    }


def test_without_the_guard_side_effects_pass_the_verifiers(runtime, golden):
    """The baseline the guard improves on: task verifiers check the asked-for change, not the rest."""
    report = rates(run_probes(runtime, golden, guard=False))
    assert report["false_positives"] and all(fp.endswith("/side_effect") for fp in report["false_positives"])


def test_side_effect_is_named_in_the_evidence(runtime, golden):
    task = golden.task("t04_return_headphones")
    _probe, policy = next((p, pol) for p, pol in probes_for(runtime, golden, task) if p.kind == "side_effect")
    trajectory = run_episode(runtime, golden, task, policy)
    assert trajectory.verdict == "partial" and trajectory.reward == 0.1
    assert trajectory.evidence["side_effects"] and all(isinstance(s, str) for s in trajectory.evidence["side_effects"])
    unguarded = run_episode(runtime, golden, task, policy, EpisodeConfig(side_effects=False))
    assert unguarded.verdict == "complete" and "side_effects" not in unguarded.evidence


def test_a_read_only_task_with_a_write_is_not_complete(runtime, golden):
    task = golden.task("t07_cheapest_audio")
    policy = ScriptPolicy(
        "writer",
        [("search_products", {"category": "audio"}), ("update_customer_email", {"customer_id": 3, "email": "x@y.z"})],
        task.answer,
    )
    trajectory = run_episode(runtime, golden, task, policy)
    assert trajectory.verdict == "partial"  # the task's verifier notices the changed table itself here


def test_footprint_compares_cells_rows_and_insert_counts():
    reference = DbDiff.model_validate(
        {
            "tables": {
                "orders": {
                    "updated": [
                        {
                            "key": {"id": 1},
                            "before": {"id": 1, "status": "paid", "note": ""},
                            "after": {"id": 1, "status": "shipped", "note": ""},
                        }
                    ],
                    "inserted": [{"id": 9}],
                }
            }
        }
    )
    footprint = Footprint.of(reference)
    assert footprint.overreach(reference) == []
    other_column = DbDiff.model_validate(
        {
            "tables": {
                "orders": {
                    "updated": [
                        {
                            "key": {"id": 1},
                            "before": {"id": 1, "status": "paid", "note": ""},
                            "after": {"id": 1, "status": "shipped", "note": "x"},
                        }
                    ]
                }
            }
        }
    )
    assert footprint.overreach(other_column) == ["orders row {\"id\": 1} column 'note' changed"]
    more_rows = DbDiff.model_validate(
        {"tables": {"orders": {"inserted": [{"id": 9}, {"id": 10}]}, "audit": {"deleted": [{"id": 3}]}}}
    )
    assert footprint.overreach(more_rows) == [
        'audit row {"id": 3} deleted',
        "2 row(s) inserted into orders (the task needs 1)",
    ]


def test_a_task_without_a_reference_solution_gets_the_verifiers_verdict(runtime, golden):
    """No footprint to compare with: the guard stays out, and the evidence says so."""
    task = golden.task("t04_return_headphones")
    _probe, policy = next((p, pol) for p, pol in probes_for(runtime, golden, task) if p.kind == "side_effect")
    bare = task.model_copy(update={"solution": []})
    trajectory = run_episode(runtime, golden, bare, ScriptPolicy("extra", policy.calls, policy.answer))
    assert trajectory.verdict == "complete" and trajectory.reward == 1.0
    assert "no reference solution" in trajectory.evidence["side_effect_guard"]
    assert "side_effects" not in trajectory.evidence


def test_imported_tasks_without_solutions_are_judged_by_their_verifiers(runtime, tmp_path):
    """The AWM release ships no solutions.json: a correct write must not be turned into partial."""
    import json
    import shutil

    from conftest import REPO

    from worldsmith.interop.awm import SOLUTIONS_FILE, import_scenario, read_release

    sample = REPO / "tests" / "data" / "awm_format_sample"
    release = tmp_path / "release"
    shutil.copytree(sample, release, ignore=shutil.ignore_patterns(SOLUTIONS_FILE))
    (scenario,) = read_release(release)
    bundle = import_scenario(scenario, runtime, "code").bundle
    assert bundle is not None and all(not t.solution for t in bundle.tasks)
    solved = {s["task_idx"]: s for s in json.loads((sample / SOLUTIONS_FILE).read_text())["solutions"]}
    checked = 0
    for index, task in enumerate(bundle.tasks):
        known = solved.get(index)
        if known is None or not any(c["operation_id"] in {"cancel_hold", "place_hold"} for c in known["calls"]):
            continue
        calls = [(c["operation_id"], c["arguments"]) for c in known["calls"]]
        trajectory = run_episode(
            runtime, bundle, task, ScriptPolicy("correct", calls, known["final_answer"] or "Done.")
        )
        assert trajectory.verdict == "complete" and trajectory.reward == 1.0, (task.id, trajectory.evidence)
        assert "no reference solution" in trajectory.evidence["side_effect_guard"]
        checked += 1
    assert checked >= 2  # writes among the imported tasks, each judged by its verifier alone


def test_the_guard_is_switchable_in_evaluate_and_train_parameters():
    from worldsmith.flows.evaluate import EvaluateParameters
    from worldsmith.training.config import TrainingConfig

    assert EvaluateParameters(set_name="s").side_effects is True
    assert EvaluateParameters(set_name="s", side_effects=False).side_effects is False
    assert TrainingConfig(model="tiny", set_name="s", side_effects=False).side_effects is False
    for model in (EvaluateParameters, TrainingConfig):
        assert model.model_json_schema()["properties"]["side_effects"]["description"]  # the Prefect form explains it
