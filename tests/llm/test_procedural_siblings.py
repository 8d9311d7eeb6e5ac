"""The procedural generator's sibling tasks: every task of a world comes with another of its kind (the
same tools in the same order, the same solution shape) on other records or values, in every domain and
in the variants scenarios draw, so that a task of every kind can be held out of training."""

from __future__ import annotations

from collections import defaultdict

import pytest

from worldsmith.llm.procedural.agent_tasks import KINDS, SIBLINGS, TASKS
from worldsmith.llm.procedural.backend import world_for
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.llm.procedural.compose import compose
from worldsmith.llm.procedural.drafts import TaskDraft
from worldsmith.models.bundle import Scenario

pytestmark = pytest.mark.unit


def _by_kind(tasks: list[TaskDraft]) -> dict[tuple[str, ...], list[TaskDraft]]:
    kinds: dict[tuple[str, ...], list[TaskDraft]] = defaultdict(list)
    for task in tasks:
        kinds[tuple(step.tool for step in task.solution)].append(task)
    return kinds


def _assert_siblings(tasks: list[TaskDraft]) -> None:
    assert len(tasks) == TASKS
    for tools, siblings in _by_kind(tasks).items():
        assert len(siblings) >= SIBLINGS, f"{siblings[0].id} ({', '.join(tools)}) has no sibling"
        assert len({t.instruction for t in siblings}) == len(siblings)  # other records or values
        assert len({repr([s.arguments for s in t.solution]) for t in siblings}) == len(siblings)
        shapes = {tuple(tuple(sorted(s.arguments)) for s in t.solution) for t in siblings}
        assert len(shapes) == 1  # the same arguments named at every step
        assert len({t.answer is None for t in siblings}) == 1  # all questions or all actions
        answers = [t.answer for t in siblings if t.answer is not None]
        assert len(set(answers)) == len(answers)  # a memorised answer passes no sibling


@pytest.mark.parametrize("domain", DOMAINS, ids=[d.key for d in DOMAINS])
def test_every_task_of_every_domain_has_a_sibling_of_its_kind(domain):
    for seed in range(3):
        _assert_siblings(compose(domain, seed).tasks)


def test_the_variants_scenarios_draw_have_siblings_too():
    for domain in DOMAINS:
        for company in ("Acme", "Globex"):
            scenario = Scenario(name=f"{company} {domain.title}", description="-", categories=[domain.key])
            _assert_siblings(world_for(scenario, 20261101).tasks)


def test_siblings_act_on_other_rows():
    """Two tasks never change the same row: a sibling is on another record, not the same one again."""
    world = compose(next(d for d in DOMAINS if d.key == "retail"), 0)
    targets = [
        (step.tool, value)
        for task in world.tasks
        for step in task.solution[1:]
        if not step.tool.startswith(("create_", "list_"))
        for key, value in step.arguments.items()
        if key.endswith("_id")
    ]
    assert len(targets) == len(set(targets))
    assert len(_by_kind(world.tasks)) == KINDS
