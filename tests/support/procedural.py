"""A procedural world's generation work, part way: what tests of the later stages start from."""

from __future__ import annotations

_WORK: dict[tuple[str, int], tuple] = {}


def procedural_work(runtime, scenario_name: str = "Amazon", seed: int = 2):
    """An environment's work after the tasks, database and tools stages (procedural backend, offline),
    and its world's verifiers as the procedural backend writes them (made once per test session)."""
    if (scenario_name, seed) not in _WORK:
        _WORK[(scenario_name, seed)] = _procedural_work(runtime, scenario_name, seed)
    return _WORK[(scenario_name, seed)]


def _procedural_work(runtime, scenario_name: str, seed: int):
    from worldsmith.llm.procedural.backend import ProceduralGenerator, world_for
    from worldsmith.models.bundle import Scenario
    from worldsmith.stages.attempts import AttemptLog
    from worldsmith.stages.database import run_database_stage
    from worldsmith.stages.task_list import run_tasks_stage
    from worldsmith.stages.tools import run_tools_stage
    from worldsmith.stages.work import EnvWork

    scenario = Scenario(name=scenario_name, description="An online store: customers order, pay and return products.")
    generator, log = ProceduralGenerator(seed=seed), AttemptLog("offline")
    work = EnvWork.start(scenario, seed)
    work = run_tasks_stage(work, generator, log, 1)
    work = run_database_stage(work, generator, log, 1)
    work = run_tools_stage(work, generator, runtime, log, 1)
    world = world_for(scenario, seed)
    solutions = [
        {"task_id": t.id, "solution": [step.model_dump() for step in t.solution], "answer": t.answer}
        for t in world.tasks
    ]
    return work, {"verifiers_py": world.verifiers_py, "solutions": solutions}


def over_strict(verifiers: dict) -> dict:
    """`verifiers` with every counting task's answer compared as exact text."""
    import re

    source, count = re.subn(
        r"said = _states_count\(answer, .*, (\d+)\)\n",
        r'said = (answer or "").strip() == "\1"\n',
        verifiers["verifiers_py"],
    )
    assert count >= 1
    return {**verifiers, "verifiers_py": source}
