"""Pydantic specs of the generation stages: what each stage asks the generator for. They are the
structured-output schemas of LLM calls and the shape the procedural backend answers in."""

from __future__ import annotations

from typing import Literal, get_args

from pydantic import BaseModel, Field

from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import Conventions, Invariant, Scenario, SolutionStep


class ScenarioBatch(BaseModel):
    """Stage `scenario`: new scenarios expanded from the seeds."""

    scenarios: list[Scenario] = Field(min_length=1)


class TaskDraftSpec(BaseModel):
    id: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$", description="snake_case task id")
    instruction: str = Field(min_length=10, description="A self-contained user request with every value given.")
    entities: list[str] = Field(
        default_factory=list,
        description="The existing records the task refers to, each as the literal value the instruction names it by "
        "(a name, email, code or id, without quotes or words around it): every one must exist in the seed data "
        "before the task starts. Not values the agent will create.",
    )


class ActingUser(BaseModel):
    """Who the agent acts as in every task of an environment."""

    role: str = Field(
        min_length=2,
        description="Who the agent acts for: a kind of user of the product (e.g. 'customer', 'instructor'), or an "
        "operator role with access to every record (e.g. 'support operator').",
    )
    identifier: str | None = Field(
        default=None,
        description="The value identifying that user's record (an email, username or id), which the seed data must "
        "hold and every task's instruction states; null for an operator role.",
    )

    def line(self) -> str:
        """How prompts state who acts, and what tools take for it."""
        if self.identifier:
            return (
                f"the {self.role} identified by {self.identifier!r}. There is no session or logged-in user: "
                "tools whose result depends on who asks take that user's identifying value as a parameter."
            )
        return (
            f"the {self.role}, with access to every record; no user is logged in: "
            "tools take the ids or natural keys of the records they act on."
        )


class TaskList(BaseModel):
    """Stage `tasks`: who the agent acts as, and about ten tasks for the scenario."""

    acting_user: ActingUser
    tasks: list[TaskDraftSpec] = Field(min_length=1)


class SchemaSpec(BaseModel):
    """Stage `database`, step 1: the schema."""

    schema_sql: str = Field(min_length=10, description="CREATE TABLE / CREATE INDEX statements for SQLite.")
    conventions: Conventions | None = Field(
        default=None,
        description="The world's conventions, which the seed data, the tools and the verifiers will follow.",
    )
    invariants: list[Invariant] = Field(
        default_factory=list,
        max_length=20,
        description="Rules every state of the world keeps (e.g. 'a booked slot has exactly one active "
        "appointment'), each one SELECT returning the rows that break it.",
    )


class SeedSpec(BaseModel):
    """Stage `database`, step 2: seed rows making every task possible."""

    seed_sql: str = Field(min_length=10, description="INSERT statements for SQLite; every one must succeed.")


class ToolSpecEntry(BaseModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    description: str
    parameters: JsonObject = Field(description="JSON Schema of the arguments (type object).")


class ToolPlan(BaseModel):
    """Stage `tools`, step 1: the tool specification."""

    tools: list[ToolSpecEntry] = Field(min_length=1)


class ToolCode(BaseModel):
    """Stage `tools`, step 2: tools.py implementing the specification."""

    tools_py: str = Field(min_length=10)


class TaskSolution(BaseModel):
    task_id: str
    solution: list[SolutionStep] = Field(min_length=1)
    answer: str | None = None


class FindingDispute(BaseModel):
    """A repairing stage's disagreement with a review finding it was sent: the finding's id and why."""

    finding: str = Field(description="The finding's id as the repair names it, e.g. 'review-2'.")
    reason: str = Field(min_length=5)


class VerifierCode(BaseModel):
    """Stage `verifiers`: verifiers.py with one verify_<task_id> per task, and reference solutions."""

    verifiers_py: str = Field(min_length=10)
    solutions: list[TaskSolution] = Field(min_length=1)
    disputed: list[FindingDispute] = Field(
        default_factory=list,
        description="Review findings sent back as repairs that you judge are no defect: each by its id "
        "(e.g. 'review-2') with your reason; leave them unrepaired.",
    )


#: The audit categories of the review stage (the paper's audit of generated worlds).
ReviewCategory = Literal[
    "tool_crash",
    "clock_or_randomness",
    "missing_tool",
    "schema_task_mismatch",
    "task_unsolvable",
    "verifier_too_strict",
    "verifier_too_lenient",
]
REVIEW_CATEGORIES: tuple[str, ...] = get_args(ReviewCategory)


class ReviewCall(BaseModel):
    tool: str
    arguments: JsonObject = Field(default_factory=dict)


class ReviewFinding(BaseModel):
    """One suspected bug, with what it takes to check it."""

    category: ReviewCategory
    target: str = Field(
        description="The tool name (tool_crash, clock_or_randomness) or the task id (every other category)."
    )
    problem: str = Field(min_length=5, description="What is wrong, in one or two sentences.")
    call: ReviewCall | None = Field(
        None,
        description="tool_crash and clock_or_randomness: one call of the target tool with valid arguments "
        "(values from the seed data) that crashes it or gives another result at another time.",
    )
    answer: str | None = Field(
        None,
        description="verifier_too_strict: a correct final answer to the task that its verifier would reject; "
        "verifier_too_lenient (optional): the final answer given with the state `build` makes.",
    )
    build: list[ReviewCall] | None = Field(
        None,
        description="verifier_too_lenient: the tool calls, from the untouched world, that make the wrong end "
        "state its verifier would accept; verifier_too_strict (optional): the calls that make a correct end "
        "state other than the reference solution's, which its verifier would reject with `answer`.",
    )


class Review(BaseModel):
    """Stage `review`: the bugs suspected in a finished environment; an empty list when none."""

    findings: list[ReviewFinding] = Field(default_factory=list, max_length=20)
