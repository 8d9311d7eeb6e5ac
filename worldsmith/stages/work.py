"""What the generation of one environment has produced so far, passed from stage to stage."""

from __future__ import annotations

import hashlib
import json
import re
from datetime import datetime, timedelta

from pydantic import BaseModel, Field

from worldsmith.bundle.kinds import NATIVE_TOOLS
from worldsmith.llm.backend import Prompt
from worldsmith.llm.prompts import render
from worldsmith.models.bundle import Scenario
from worldsmith.models.specs import TaskList, ToolPlan, VerifierCode


def env_id_for(scenario: Scenario, seed: int) -> str:
    """A stable snake_case id: the scenario's name plus a short hash of name and seed."""
    base = re.sub(r"[^a-z0-9]+", "_", scenario.name.lower()).strip("_")[:40] or "world"
    if not base[0].isalpha():
        base = "w_" + base
    digest = hashlib.sha256(f"{scenario.name}|{seed}".encode()).hexdigest()[:6]
    return f"{base}_{digest}"


#: The span a generated world's "now" is drawn from (a weekday morning to afternoon, UTC).
CLOCK_EPOCH = datetime(2024, 1, 1, 9, 0, 0)
CLOCK_SPAN_DAYS = 730


def world_clock(scenario: Scenario, seed: int) -> str:
    """The world's "now" (ISO, UTC, to the second): fixed by scenario and seed, so a rerun writes the
    same world; between 2024-01-01 and 2025-12-31, on a weekday between 09:00 and 17:00."""
    digest = int(hashlib.sha256(f"clock|{scenario.name}|{seed}".encode()).hexdigest(), 16)
    day = CLOCK_EPOCH + timedelta(days=digest % CLOCK_SPAN_DAYS)
    day += timedelta(days=(7 - day.weekday()) % 7 if day.weekday() >= 5 else 0)
    instant = day + timedelta(seconds=(digest >> 16) % (8 * 3600))
    return instant.isoformat()


class EnvWork(BaseModel):
    """The artifacts of one environment in the making (JSON-serialisable for resumable flows)."""

    scenario: Scenario
    seed: int
    env_id: str
    now: str = Field(default_factory=lambda: CLOCK_EPOCH.isoformat())  # the world's clock (world_clock)
    tasks: TaskList | None = None
    schema_sql: str | None = None
    seed_sql: str | None = None
    tool_plan: ToolPlan | None = None
    tools_py: str | None = None
    verifiers: VerifierCode | None = None

    @classmethod
    def start(cls, scenario: Scenario, seed: int) -> EnvWork:
        """The environment of `scenario` and `seed` before any stage ran, under its stable id."""
        return cls(scenario=scenario, seed=seed, env_id=env_id_for(scenario, seed), now=world_clock(scenario, seed))

    def context(self, feedback: str | None = None) -> dict:
        """The structured facts behind every prompt of this environment."""
        return {"scenario": self.scenario.model_dump(), "seed": self.seed, "env_id": self.env_id, "feedback": feedback}

    def prompt(self, template: str, feedback: str | None, **values: object) -> Prompt:
        """Prompt `template` about this environment: its scenario's name and description, `values`,
        and the repair feedback of the previous attempt (if any)."""
        system, user = render(
            template,
            name=self.scenario.name,
            description=self.scenario.description,
            feedback=feedback or "",
            **values,
        )
        return Prompt(template, system, user, self.context(feedback))

    def task_lines(self) -> str:
        return "\n".join(f"- {t.id}: {t.instruction}" for t in (self.tasks.tasks if self.tasks else []))

    def tool_lines(self) -> str:
        return json.dumps([t.model_dump() for t in self.tool_plan.tools], indent=1) if self.tool_plan else "[]"

    def sources(self) -> dict[str, str]:
        """The five source files of the bundle (all stages must have run)."""
        assert self.tasks and self.schema_sql and self.seed_sql and self.tools_py and self.verifiers
        solutions = {s.task_id: s for s in self.verifiers.solutions}
        lines = []
        for task in self.tasks.tasks:
            solution = solutions.get(task.id)
            lines.append(
                json.dumps(
                    {
                        "id": task.id,
                        "instruction": task.instruction,
                        "verifier": f"verify_{task.id}",
                        "solution": [step.model_dump() for step in solution.solution] if solution else [],
                        "answer": solution.answer if solution else None,
                    }
                )
            )
        files = {
            "schema.sql": self.schema_sql,
            "seed.sql": self.seed_sql,
            "tools.py": self.tools_py,
            "tasks.jsonl": "\n".join(lines) + "\n",
            "verifiers.py": self.verifiers.verifiers_py,
        }
        assert set(files) == set(NATIVE_TOOLS.source_files)
        return files
