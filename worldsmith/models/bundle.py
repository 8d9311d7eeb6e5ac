"""Pydantic specs of the bundle files: manifest.json, the lines of tasks.jsonl, the entries of tools.json."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worldsmith.jsonvalue import JsonObject

BUNDLE_FORMAT = "worldsmith-bundle/1"
ENV_ID_PATTERN = re.compile(r"^[a-z][a-z0-9_]{1,63}$")


class Scenario(BaseModel):
    """The product or domain a world simulates."""

    name: str = Field(min_length=1)
    description: str = ""
    categories: list[str] = Field(default_factory=list)


class SeededBranch(BaseModel):
    """Which outcome the seed data sets up for one conditional task ("refund if within 30 days": which side)."""

    task_id: str
    branch: str = Field(description="The branch the seed data makes true, e.g. 'the order is 12 days old: refund'.")


class Conventions(BaseModel):
    """The conventions of one world, written once (by the schema step) and shown to every later stage, so
    the seed, the tools and the verifiers agree on them. Every field may be empty (not stated)."""

    codes: str = Field(
        default="",
        description="The format of codes and identifiers the world shows (confirmation codes, order numbers, "
        "SKUs) and how a tool makes a new one, e.g. 'confirmation codes are CNF-<6 digits>, "
        "CNF- plus the new booking id zero-padded'.",
    )
    timestamps: str = Field(
        default="",
        description="How dates and times are stored, e.g. 'dates YYYY-MM-DD; instants YYYY-MM-DDTHH:MM:SS in UTC'.",
    )
    units: str = Field(
        default="",
        description="Units of amounts, e.g. 'money as integer cents in *_cents columns; distances in miles'.",
    )
    rules: list[str] = Field(
        default_factory=list,
        description="Fees and business rules the tools enforce and the verifiers expect, one a line, e.g. "
        "'cancelling less than 24 h before the start costs a fee of 10% of the price'.",
    )
    seeded_branches: list[SeededBranch] = Field(
        default_factory=list, description="For each task whose outcome depends on the data: the branch seeded."
    )

    def lines(self) -> str:
        """The conventions as the prompts of later stages state them."""
        parts = [
            f"- {label}: {text}"
            for label, text in (("codes", self.codes), ("dates and times", self.timestamps), ("units", self.units))
            if text.strip()
        ]
        parts += [f"- rule: {rule}" for rule in self.rules if rule.strip()]
        parts += [f"- task {b.task_id} is seeded for: {b.branch}" for b in self.seeded_branches]
        return "\n".join(parts)


class GeneratorInfo(BaseModel):
    """Who wrote the bundle: backend, model, prompt version and seed."""

    backend: str = "handwritten"
    model: str | None = None
    prompt_version: str | None = None
    seed: int | None = None


class Manifest(BaseModel):
    """`manifest.json`: identity, provenance and the sha256 of every artifact."""

    model_config = ConfigDict(extra="allow")

    format: str = BUNDLE_FORMAT
    env_id: str
    version: int | None = None
    scenario: Scenario
    generator: GeneratorInfo = Field(default_factory=GeneratorInfo)
    artifacts: dict[str, str] = Field(default_factory=dict)
    #: Counts by name (tables, rows, tools, tasks, lines_of_code, world_bytes; a failed world's: those known).
    stats: dict[str, int] = Field(default_factory=dict)
    #: Each quality check's summary by kind (storage/publish.py): {kind: {"passed": bool, ...}}.
    quality: dict[str, JsonObject] = Field(default_factory=dict)
    #: The kinds of the environment's tools and verifiers, by name (worldsmith/bundle/kinds.py). Tools:
    #: unset, plain functions in tools.py (tools.json derived from them); "asgi", routes of the FastAPI
    #: app in app.py (tools.json recorded from its routes at import). Verifiers: unset, `verify(initial,
    #: final, answer)` on read-only connections; "awm-code" / "awm-sql", the AgentWorldModel-1K functions
    #: on read-only database files.
    tools_kind: Literal["asgi"] | None = None
    verifiers_kind: Literal["awm-code", "awm-sql"] | None = None
    #: Where the environment came from when it was not generated here (e.g. the AWM release).
    origin: JsonObject | None = None
    #: The world's "now" (ISO, UTC, to the second): what its tools' clock reads answer, so episodes
    #: replay to the same database. None: an older bundle (its origin may still carry one).
    clock: str | None = None
    #: The world's conventions (formats, units, rules, seeded branches) as its generation wrote them; None:
    #: an older bundle, or one not generated here.
    conventions: Conventions | None = None

    @field_validator("format")
    @classmethod
    def _known_format(cls, value: str) -> str:
        if value != BUNDLE_FORMAT:
            raise ValueError(f"unsupported bundle format {value!r}; expected {BUNDLE_FORMAT!r}")
        return value

    @field_validator("clock")
    @classmethod
    def _iso_instant(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.fromisoformat(value)
            except ValueError:
                raise ValueError(f"clock {value!r} is not an ISO instant (e.g. 2025-03-14T09:30:00)") from None
        return value

    @field_validator("env_id")
    @classmethod
    def _snake_case(cls, value: str) -> str:
        if not ENV_ID_PATTERN.match(value):
            raise ValueError(f"env_id {value!r} must be snake_case: [a-z][a-z0-9_]{{1,63}}")
        return value


class SolutionStep(BaseModel):
    """One tool call of a reference solution."""

    tool: str
    arguments: JsonObject = Field(default_factory=dict)


class TaskSpec(BaseModel):
    """One line of `tasks.jsonl`: a user request with its verifier and reference solution."""

    id: str = Field(min_length=1)
    instruction: str = Field(min_length=1)
    verifier: str = Field(min_length=1)
    solution: list[SolutionStep]
    answer: str | None = None


class Invariant(BaseModel):
    """One entry of `invariants.json` (optional): a rule every state of the world keeps, stated in one line
    (`statement`) and as a read-only query (`sql`, one SELECT) that returns the rows breaking it, none when
    it holds. Checked on the seed and on every reference solution's end state (bundle/invariants.py)."""

    id: str = Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")
    statement: str = Field(min_length=5, description="The rule in one line, e.g. 'a booked slot has one appointment'.")
    sql: str = Field(min_length=10, description="One SELECT returning the rows that break the rule (none: it holds).")


class ToolSchema(BaseModel):
    """One entry of `tools.json`: name, description and JSON Schema of the arguments."""

    name: str
    description: str
    parameters: JsonObject

    def argument_schemas(self) -> dict[str, JsonObject]:
        """The JSON Schema of each argument by name (`parameters["properties"]`; those that are objects)."""
        properties = self.parameters.get("properties")
        if not isinstance(properties, dict):
            return {}
        return {name: schema for name, schema in properties.items() if isinstance(schema, dict)}

    def required_arguments(self) -> list[str]:
        """The arguments `parameters["required"]` names."""
        required = self.parameters.get("required")
        return [name for name in required if isinstance(name, str)] if isinstance(required, list) else []
