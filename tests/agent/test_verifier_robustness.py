"""Adversarial trajectories against the golden bundle and procedural worlds; the side-effect guard."""

from __future__ import annotations

import pytest
from support.patience import MOMENTS_S
from support.procedural import over_strict, procedural_work

from worldsmith.agent.adversarial import probes_for, rates, run_probes
from worldsmith.agent.footprint import Footprint
from worldsmith.agent.loop import EpisodeConfig, run_episode
from worldsmith.agent.policies import ScriptPolicy
from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.models.results import DbDiff

pytestmark = pytest.mark.sandbox


def test_golden_bundle_has_no_false_positive_or_negative(runtime, golden):
    probes = run_probes(runtime, golden)
    report = rates(probes)
    assert report["false_positives"] == [] and report["false_negatives"] == []
    kinds = {p.kind for p in probes}
    assert kinds == {"reference", "nothing", "claim", "wrong_entity", "side_effect", "half", "answer_variant"}
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


#: A task's reference diff: one order's status changed, one order inserted.
REFERENCE_DIFF = DbDiff.model_validate(
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


@pytest.mark.unit
def test_a_footprint_admits_its_own_diff():
    assert Footprint.of(REFERENCE_DIFF).overreach(REFERENCE_DIFF) == []


@pytest.mark.unit
def test_a_footprint_names_a_cell_the_task_does_not_change():
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
    assert Footprint.of(REFERENCE_DIFF).overreach(other_column) == ["orders row {\"id\": 1} column 'note' changed"]


@pytest.mark.unit
def test_a_footprint_names_rows_beyond_the_tasks_count():
    more_rows = DbDiff.model_validate(
        {"tables": {"orders": {"inserted": [{"id": 9}, {"id": 10}]}, "audit": {"deleted": [{"id": 3}]}}}
    )
    assert Footprint.of(REFERENCE_DIFF).overreach(more_rows) == [
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

    from support.paths import REPO

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


@pytest.mark.unit
def test_every_flow_that_verifies_can_switch_the_side_effects_guard():
    from worldsmith.tasks.parameters import EvaluateParameters
    from worldsmith.training.config import TrainingConfig

    assert EvaluateParameters(set_name="s").side_effects is True
    assert EvaluateParameters(set_name="s", side_effects=False).side_effects is False
    assert TrainingConfig(model="tiny", set_name="s", side_effects=False).side_effects is False
    for model in (EvaluateParameters, TrainingConfig):
        assert model.model_json_schema()["properties"]["side_effects"]["description"]  # the Prefect form explains it


# -- verifier false negatives: correct answers worded otherwise (issue 21) --------------------------------------


@pytest.mark.unit
def test_answer_variants_say_the_same_thing_otherwise():
    from worldsmith.agent.answer_variants import answer_variants, formatted, list_items

    assert formatted("1250") == "1,250" and formatted("$1250.00") == "1,250.00 USD" and formatted("12.50") == "$12.50"
    assert formatted("due 2026-03-05") == "due March 5, 2026" and formatted("account 39603062") == "account 39603062"
    assert formatted("SP-4100") == "SP-4100"  # a code, not a quantity
    for answer in ("1250", "SP-410", "KB-101, MS-220, WC-900", "2026-03-05", None):
        variants = dict(answer_variants(answer))
        assert {"reworded", "extra_context", "excluded"} <= set(variants)
        assert answer not in variants.values() and len(set(variants.values())) == len(variants)
        assert "left out" in variants["excluded"]
    listed = dict(answer_variants("KB-101, MS-220, WC-900"))
    assert listed["list_bulleted"].splitlines()[1:] == ["* WC-900", "* MS-220", "* KB-101"]
    assert listed["list_reordered"] == "WC-900, MS-220 and KB-101"
    assert list_items("Order 1004 was shipped. It arrives soon.") == []


@pytest.mark.unit
@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("$5,750.00", "5,750.00 USD"),
        ("The total is €1,234,567.89.", "The total is 1,234,567.89 EUR."),
        ("£ 12,000", "12,000 GBP"),
        ("5,750.00", "$5,750.00"),
        ("Paid 1,250.00 on 2026-03-05", "Paid $1,250.00 on March 5, 2026"),
        ("$5750.00 and $12.50", "5,750.00 USD and 12.50 USD"),
    ],
)
def test_amounts_with_separators_are_formatted_as_whole_numbers(answer, expected):
    from worldsmith.agent.answer_variants import formatted

    assert formatted(answer) == expected


def _with_verifiers(bundle, verifiers_py: str):
    from worldsmith.bundle.loader import build_bundle

    sources = {name: bundle.files[name] for name in ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl")}
    sources["verifiers.py"] = verifiers_py
    return build_bundle(sources, {"env_id": bundle.env_id, "scenario": bundle.manifest.scenario.model_dump()})


def test_an_over_strict_answer_check_is_a_false_negative(runtime, golden):
    """The issue's miss: an agent's correct answer judged partial by a verifier that compares text exactly."""
    from worldsmith.agent.adversarial import answer_variant_failures

    assert answer_variant_failures(runtime, golden) == []
    loose = 'said = str(balance) in (answer or "").replace(",", "")'
    source = golden.text("verifiers.py")
    assert loose in source
    strict = _with_verifiers(golden, source.replace(loose, 'said = (answer or "").strip() == str(balance)'))
    failed = answer_variant_failures(runtime, strict)
    assert failed and {p.task_id for p in failed} == {"t01_points_balance"}
    assert {"reworded", "formatted", "excluded"} <= {p.variant for p in failed}
    from support.bundles import narrowed

    report = rates(run_probes(runtime, narrowed(strict, ("t01_points_balance",))))
    assert report["answer_variant_false_negative_rate"] > 0 and report["false_positive_rate"] == 0.0
    assert any(line.startswith("retail_store/t01_points_balance/answer_variant[") for line in report["false_negatives"])


def test_the_verifiers_stage_has_an_over_strict_verifier_rewritten(runtime):
    """The model's first verifiers compare a count's text exactly: the stage's check runs the answer
    variants, names the task, variant and verdict, and the model's second answer is accepted."""
    from support.llm_server import ScriptedLLM, json_reply

    from worldsmith.llm.openai_backend import OpenAIGenerator
    from worldsmith.stages.attempts import AttemptLog
    from worldsmith.stages.verifiers import run_verifiers_stage

    work, verifiers = procedural_work(runtime)
    server = ScriptedLLM([json_reply(over_strict(verifiers)), json_reply(verifiers)])
    with server.serve() as background:
        generator = OpenAIGenerator(model="m", base_url=f"{background.url}/v1", timeout_s=MOMENTS_S, retries=1)
        log = AttemptLog("strict")
        done = run_verifiers_stage(work, generator, runtime, log, max_attempts=3)
    first, second = log.attempts
    assert (first.outcome, first.error_class) == ("failure", "verifier_false_negative")
    assert "_list" in first.error_text and "reworded answer" in first.error_text and "incomplete" in first.error_text
    assert second.outcome == "success" and done.verifiers.verifiers_py == verifiers["verifiers_py"]
    assert "judge the answer by its content" in server.requests[1]["messages"][1]["content"]  # fed back
