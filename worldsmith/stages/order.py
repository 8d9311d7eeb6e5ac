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
