"""The generation stages, named once and in the order they run. Their values are the stage names
stored in the catalog's stage-attempt records; a stage that asks twice records each step as
`stage:step` (`database:schema`, `database:seed`, `tools:spec`, `tools:code`)."""

from __future__ import annotations

from enum import StrEnum


class Stage(StrEnum):
    """One stage of the pipeline: scenarios for the run, then per environment the rest in this order."""

    SCENARIO = "scenario"
    TASKS = "tasks"
    DATABASE = "database"
    TOOLS = "tools"
    VERIFIERS = "verifiers"
    VALIDATE = "validate"
    REVIEW = "review"  # optional, after a validation that passed (stages/review.py)

    def step(self, name: str) -> str:
        """The record name of one step of this stage (`database:schema`)."""
        return f"{self.value}:{name}"


#: The stages that make one environment's artifacts, in order. Validation sends a failure back to
#: one of them; it runs again with the error fed back, and so do the stages after it.
ENVIRONMENT_STAGES: tuple[Stage, ...] = (Stage.TASKS, Stage.DATABASE, Stage.TOOLS, Stage.VERIFIERS)

#: The steps of the stages that ask more than once, in order. Feedback for a step runs the stage from
#: that step, keeping what the steps before it made (a seed error keeps the schema).
STEPS: dict[Stage, tuple[str, ...]] = {Stage.DATABASE: ("schema", "seed"), Stage.TOOLS: ("spec", "code")}


#: Every name a stage attempt is recorded under, in the order the pipeline runs them: a stage that asks
#: twice by its steps (`tools:spec` before `tools:code`), after its own name (older records).
RECORD_NAMES: tuple[str, ...] = tuple(
    name for stage in Stage for name in (stage.value, *(stage.step(step) for step in STEPS.get(stage, ())))
)


def pipeline_position(record: str) -> tuple[int, int, str]:
    """Sort key of a stage attempt's record name (`tools:spec`, or a label that starts with one:
    `tools:spec: SyntaxError`): its stage in pipeline order, then its step in the stage's order, unknown
    ones after the known; ties by name."""
    order = [s.value for s in Stage]
    head, _, rest = record.partition(":")
    if head not in order:
        return (len(order), 0, record)
    steps = STEPS.get(Stage(head), ())
    step = rest.partition(":")[0]
    return (order.index(head), steps.index(step) + 1 if step in steps else 0, record)
