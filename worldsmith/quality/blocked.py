"""`Probe.TASK_NOT_BLOCKED`: a task whose reference solution has a call that ends in a ToolError, or whose
instruction names a record (a quoted name, an email, a `#id`, a code) that the seed lacks, cannot be
completed as stated."""

from __future__ import annotations

import re
from typing import Any

from worldsmith.bundle.contract import Bundle
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.specs import ActingUser, TaskDraftSpec, TaskList
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.seedview import instruction_literals, literal_keys, missing_entities
from worldsmith.quality.tool_calls import RefusedStep
from worldsmith.quality.tool_tables import is_read_tool


def blocked_tasks(bundle: Bundle, refused: dict[str, RefusedStep]) -> list[ProbeResult]:
    """`Probe.TASK_NOT_BLOCKED` per task: its reference solution has no refused call (`refused`, by task
    id), and every record its instruction names is in the seed (quality/seedview.py): its quoted names,
    emails, `#ids` and codes but the values its reference solution writes; without a reference
    solution (imported tasks) only its `#ids` and codes, as a new name or comment cannot be told
    from an existing one. A task blocked both ways is the seed's to fix (its detail names both)."""
    tasks = []
    for task in bundle.tasks:
        literals = _literals(task.instruction)
        if task.solution:
            written = _written_values(task)
            named = [v for v in literals if not literal_keys(v) & written]
        else:
            named = [v for v in literals if "@" not in v and instruction_literals(v) == [v]]
        tasks.append(TaskDraftSpec.model_construct(id=task.id, instruction=task.instruction, entities=named))
    missing = missing_entities(bundle.world, TaskList.model_construct(acting_user=ActingUser(role="user"), tasks=tasks))
    results = []
    for task in bundle.tasks:
        step, absent = refused.get(task.id), missing.get(task.id)
        reasons = [step.detail] if step else []
        if absent:
            reasons.append(f"its instruction names {absent}, which no row of the seed holds")
        detail = "; ".join(reasons)
        if absent:
            failure = ProbeFailure.BLOCKED_BY_MISSING_RECORD
            results.append(ProbeResult.failing(failure, task.id, detail, cause=", ".join(absent)))
        elif step:
            results.append(ProbeResult.failing(ProbeFailure.BLOCKED_BY_REFUSED_STEP, task.id, detail, cause=step.step))
        else:
            results.append(ProbeResult.passing(Probe.TASK_NOT_BLOCKED, task.id, "not blocked"))
    return results


_APOSTROPHE = re.compile(r"(?<=\w)'(?=\w)")
_KEPT = "\ue000"  # an apostrophe inside a word while quotes are looked for


def _literals(instruction: str) -> list[str]:
    """instruction_literals, an apostrophe inside a word ("won't", "O'Brien") not taken for a quote."""
    kept = _APOSTROPHE.sub(_KEPT, instruction)
    return [literal.replace(_KEPT, "'") for literal in instruction_literals(kept)]


def _written_values(task: TaskSpec) -> set[str]:
    """The comparable forms of the values `task`'s reference solution passes to tools that do not
    only read (new names, new emails: the instruction names them, the seed need not hold them)."""
    keys: set[str] = set()
    for step in task.solution:
        if is_read_tool(step.tool):
            continue
        for value in _leaves(step.arguments):
            keys |= literal_keys(str(value))
    return keys


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    if isinstance(value, list):
        return [leaf for v in value for leaf in _leaves(v)]
    return [value]
