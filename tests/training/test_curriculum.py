"""The training curriculum (TrainingConfig.curriculum): tasks chosen by the length of their reference
solutions, episodes that show only a solution's tools, and the lazy-habit warm-up rows."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from worldsmith.llm.procedural.backend import procedural_bundle
from worldsmith.training.config import Curriculum, TrainingConfig
from worldsmith.training.curriculum import curriculum_bundles, held_out_bundles, solution_size, task_kind
from worldsmith.training.warmup import lazy_rows, reference_rows, warmup_rows

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def worlds():
    return {"retail": procedural_bundle("retail", 0), "clinic": procedural_bundle("clinic", 0)}


def test_the_default_curriculum_changes_nothing(worlds):
    assert curriculum_bundles(worlds, Curriculum()) == worlds


def test_a_curriculum_chooses_the_shortest_solutions_one_per_kind(worlds):
    curriculum = Curriculum(tasks=3, tools="solution")
    chosen = curriculum_bundles(worlds, curriculum)
    tasks = {key: bundle.tasks[0] for key, bundle in chosen.items()}
    assert len(chosen) == 3 and all(len(b.tasks) == 1 for b in chosen.values())
    kinds = {task_kind(chosen[key], task, curriculum) for key, task in tasks.items()}
    assert len(kinds) == 3  # no two of one kind: each one's siblings stay out of training
    others = [
        solution_size(t)
        for key, w in worlds.items()
        for t in w.tasks
        if t not in tasks.values() and t.solution and task_kind(w, t, curriculum) not in kinds
    ]
    assert max(solution_size(t) for t in tasks.values()) <= min(others)


def test_a_curriculum_takes_a_second_task_of_a_kind_only_when_every_kind_is_chosen():
    world = {"retail": procedural_bundle("retail", 0)}
    curriculum = Curriculum(tasks=6, tools="solution")
    kinds = [task_kind(world["retail"], b.tasks[0], curriculum) for b in curriculum_bundles(world, curriculum).values()]
    assert len(kinds) == 6 and len(set(kinds)) == 5  # five kinds a world, then one sibling


def test_a_solution_curriculum_shows_each_task_only_its_solutions_tools(worlds):
    for key, bundle in curriculum_bundles(worlds, Curriculum(tasks=3, tools="solution")).items():
        (task,) = bundle.tasks
        assert key == f"{key.split('#')[0]}#{task.id}"
        assert {t.name for t in bundle.tools} == {s.tool for s in task.solution}


def test_a_task_count_alone_keeps_each_bundles_tools(worlds):
    chosen = curriculum_bundles(worlds, Curriculum(tasks=4))
    assert sum(len(b.tasks) for b in chosen.values()) == 4
    assert all(b.tools == worlds[key].tools for key, b in chosen.items())


@pytest.mark.sandbox
def test_lazy_rows_answer_done_one_call_short_of_the_solution(worlds, runtime):
    bundles = list(curriculum_bundles(worlds, Curriculum(tasks=2, tools="solution")).values())
    lazy, right = lazy_rows(runtime, bundles, 3), reference_rows(runtime, bundles, 3)
    solutions = [b.tasks[0].solution for b in bundles]
    assert len(lazy) == sum(len(s) for s in solutions) and len(right) == sum(len(s) + 1 for s in solutions)
    answers = [row["completion"][0] for row in lazy if not row["completion"][0].get("tool_calls")]
    assert [a["content"] for a in answers] == ["Done.", "Done."]
    shown = {t["function"]["name"] for row in lazy + right for t in json.loads(row["tools"])}
    assert shown == {s.tool for solution in solutions for s in solution}


@pytest.mark.sandbox
def test_lazy_habit_warms_up_even_odds_where_it_departs(worlds, runtime):
    """At the turn where the lazy habit answers "Done." the warm-up holds the reference's call once and the
    lazy answer once: the mix a warm-up converges to, whatever its length."""
    bundles = list(curriculum_bundles(worlds, Curriculum(tasks=2, tools="solution")).values())
    rows = warmup_rows(runtime, bundles, 3, lazy_habit=True)
    assert rows[: len(reference_rows(runtime, bundles, 3))] == reference_rows(runtime, bundles, 3)
    departs = [row for row in rows if row["completion"][0].get("content") == "Done." and row["reward"] == 0]
    assert len(departs) == len(bundles)
    for lazy in departs:
        same_window = [row["completion"][0] for row in rows if row["prompt"] == lazy["prompt"]]
        assert len(same_window) == 2 and sum(bool(turn.get("tool_calls")) for turn in same_window) == 1
    assert warmup_rows(runtime, bundles, 3, lazy_habit=False) == reference_rows(runtime, bundles, 3)


def test_success_is_measured_in_the_real_worlds_only():
    with pytest.raises(ValidationError, match="success_samples"):
        TrainingConfig(model="tiny", set_name="s", success_samples=4, simulate={"world_model": "hf:/nowhere"})


def test_held_out_tasks_share_a_trained_tasks_tools_on_other_records():
    """Held-out tasks of the same kind: a sibling (the same world's or another world's of the domain, other
    records) whose task calls the same tools in the same order, shown with the same tool definitions;
    never a trained task."""
    worlds = {f"retail_{seed}": procedural_bundle("retail", seed) for seed in range(3)}
    curriculum = Curriculum(tasks=2, tools="solution")
    trained = curriculum_bundles(worlds, curriculum)
    held_out = held_out_bundles(worlds, curriculum)
    assert len(held_out) == len(trained) and not set(held_out) & set(trained)  # one for every trained task
    kinds = {task_kind(b, b.tasks[0], curriculum) for b in trained.values()}
    for bundle in held_out.values():
        (task,) = bundle.tasks
        assert task_kind(bundle, task, curriculum) in kinds
        assert task.instruction not in {b.tasks[0].instruction for b in trained.values()}  # other records
        assert [t.model_dump() for t in bundle.tools] in [[t.model_dump() for t in b.tools] for b in trained.values()]
    assert len(held_out_bundles(worlds, curriculum, per_task=2)) >= len(held_out)
    assert held_out_bundles(worlds, Curriculum()) == {}  # training on every task leaves none out


def test_every_trained_task_of_one_world_has_a_held_out_sibling_in_it():
    """One world alone holds a held-out task for each trained one: the generator's siblings."""
    world = {"clinic": procedural_bundle("clinic", 1)}
    for tools in ("solution", "all"):
        curriculum = Curriculum(tasks=5, tools=tools)
        held_out = held_out_bundles(world, curriculum)
        assert len(held_out) == 5 and all(key.startswith("clinic#") for key in held_out)


@pytest.mark.sandbox
def test_a_reference_turn_longer_than_the_completion_limit_is_named(worlds, runtime, tiny_model):
    """`turn_tokens` and `overlong`: a task whose reference turn GRPO would cut at `max_completion_length`
    (a format error on every rollout: the demo's create task at 51 tokens under 48) is named with its
    length."""
    from worldsmith.training.warmup import overlong, turn_tokens

    bundles = list(curriculum_bundles(worlds, Curriculum(tasks=2, tools="solution")).values())
    longest = turn_tokens(tiny_model, reference_rows(runtime, bundles, 3))
    assert set(longest) == {f"{b.env_id}/{b.tasks[0].id}" for b in bundles}
    assert all(tokens > 5 for tokens in longest.values())  # a tool call with its arguments, then the end
    assert overlong(longest, min(longest.values()) - 1) == longest
    assert overlong(longest, max(longest.values())) == {}


def test_a_sibling_that_expects_the_trained_answer_is_not_held_out(worlds):
    """Count tasks ask for a number: a sibling whose expected answer is the trained task's would be
    passed by the memorised answer, so it is no held-out task."""
    import dataclasses

    world = worlds["retail"]
    counts = tuple(t for t in world.tasks if t.answer is not None)[:2]
    assert len(counts) == 2 and counts[0].answer != counts[1].answer
    curriculum = Curriculum(tasks=1)
    apart = {"retail": dataclasses.replace(world, tasks=counts)}
    assert len(held_out_bundles(apart, curriculum)) == 1
    alike = (counts[0], counts[1].model_copy(update={"answer": counts[0].answer}))
    assert held_out_bundles({"retail": dataclasses.replace(world, tasks=alike)}, curriculum) == {}


def test_a_tiny_model_warns_of_its_reference_turns_over_the_completion_limit(tmp_path, caplog):
    """Built or taken from the cache, a tiny model's run warns of each task whose reference turn the
    run's `max_completion_length` would cut (the lengths are kept beside the model)."""
    import logging

    from worldsmith.flows.train import TURN_TOKENS, _warn_overlong

    (tmp_path / TURN_TOKENS).write_text(json.dumps({"shipping_0/t01_create": 51, "store_0/t09_cancel": 20}))
    with caplog.at_level(logging.WARNING):
        _warn_overlong(tmp_path, 48)
    assert "shipping_0/t01_create: a turn of its reference solution takes 51 tokens" in caplog.text
    assert "t09_cancel" not in caplog.text
    caplog.clear()
    _warn_overlong(tmp_path, 64)
    assert caplog.text == ""
