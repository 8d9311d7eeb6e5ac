"""The records a procedural world is composed into before it becomes a bundle: its seed rows,
its task drafts and the draft of the whole world (every source file)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from worldsmith.llm.procedural.blocks import Domain
from worldsmith.models.bundle import Invariant, SolutionStep

#: A seed column's value: INTEGER (ids, numbers, money in cents, booleans as 0/1) or TEXT.
SeedValue: TypeAlias = int | str
#: One seed row: its "id" and a value per column.
SeedRow: TypeAlias = dict[str, SeedValue]


@dataclass
class Rows:
    """Seed rows per table, kept to pick task targets from."""

    tables: dict[str, list[SeedRow]] = field(default_factory=dict)


@dataclass
class TaskDraft:
    """One agent task: its instruction, reference solution (tool steps), the body of its verifier,
    for questions the expected answer, and the existing records it names (their labels or ids)."""

    id: str
    instruction: str
    solution: list[SolutionStep]
    verifier_body: str
    answer: str | None = None
    entities: list[str] = field(default_factory=list)


@dataclass
class WorldDraft:
    """Every source file of a world, before it becomes a bundle."""

    domain: Domain
    schema_sql: str
    seed_sql: str
    tools_py: str
    tool_names: list[str]
    tasks: list[TaskDraft] = field(default_factory=list)
    verifiers_py: str = ""
    invariants: list[Invariant] = field(default_factory=list)
