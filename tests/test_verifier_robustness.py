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
