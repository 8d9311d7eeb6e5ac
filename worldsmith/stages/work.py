"""What the generation of one environment has produced so far, passed from stage to stage."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping

from pydantic import BaseModel, Field

from worldsmith.bundle.clock import CLOCK_EPOCH, world_clock
from worldsmith.bundle.invariants import INVARIANTS_FILE, invariants_json
from worldsmith.bundle.kinds import NATIVE_TOOLS
from worldsmith.llm.backend import Generator, Prompt, PromptContext
from worldsmith.llm.prompts import prompt_version, render
from worldsmith.models.bundle import Conventions, GeneratorInfo, Invariant, Manifest, Scenario
from worldsmith.models.specs import TaskList, ToolPlan, VerifierCode
from worldsmith.stages.history import Fault, StepHistory


def env_id_for(scenario: Scenario, seed: int) -> str:
    """A stable snake_case id: the scenario's name plus a short hash of name and seed."""
    base = re.sub(r"[^a-z0-9]+", "_", scenario.name.lower()).strip("_")[:40] or "world"
    if not base[0].isalpha():
        base = "w_" + base
    digest = hashlib.sha256(f"{scenario.name}|{seed}".encode()).hexdigest()[:6]
    return f"{base}_{digest}"


class EnvWork(BaseModel):
    """The artifacts of one environment in the making (JSON-serialisable for resumable flows)."""

    scenario: Scenario
    seed: int
    env_id: str
    now: str = Field(default_factory=lambda: CLOCK_EPOCH.isoformat())  # the world's clock (world_clock)
    tasks: TaskList | None = None
    schema_sql: str | None = None
    invariants: list[Invariant] = Field(default_factory=list)  # stated with the schema (bundle/invariants.py)
    seed_sql: str | None = None
    tool_plan: ToolPlan | None = None
    tools_py: str | None = None
    verifiers: VerifierCode | None = None
    #: The step of the next stage run to start from (order.STEPS), the steps before it kept: set when a
    #: validation failure belongs to a later step than the stage's first; the stage clears it.
    resume_step: str | None = None
    #: The world's conventions, as the schema step wrote them (None: not stated); every later prompt shows them.
    conventions: Conventions | None = None
    #: Every attempt of each step so far, by its record name (`tools:code`, `verifiers`): what repair
    #: prompts carry (stages/history.py).
    history: dict[str, StepHistory] = Field(default_factory=dict)

    @classmethod
    def start(cls, scenario: Scenario, seed: int) -> EnvWork:
        """The environment of `scenario` and `seed` before any stage ran, under its stable id."""
        return cls(scenario=scenario, seed=seed, env_id=env_id_for(scenario, seed), now=world_clock(scenario, seed))

    def history_of(self, step: str) -> StepHistory:
        """A copy of the attempts of `step` so far (the stage adds its own and keeps the copy: `remembering`)."""
        return self.history.get(step, StepHistory()).model_copy(deep=True)

    def remembering(self, steps: Mapping[str, StepHistory]) -> dict[str, StepHistory]:
        """This work's history with the histories of `steps` (by record name) replaced."""
        return {**self.history, **steps}

    def rejected(self, step: str, error: str, faults: Iterable[Fault] = (), evidence: str = "") -> EnvWork:
        """This work with the latest answer of `step` rejected by a later check (validation, the review)."""
        history = self.history_of(step)
        history.reject_latest(error, faults, evidence)
        return self.model_copy(update={"history": {**self.history, step: history}})

    def conventions_lines(self) -> str:
        """The world's conventions as the prompts after the schema step state them."""
        lines = self.conventions.lines() if self.conventions else ""
        return lines or "- none stated: follow the schema and the seed rows shown"

    def context(self, feedback: str | None = None) -> PromptContext:
        """The structured facts behind every prompt of this environment."""
        return {"scenario": self.scenario.model_dump(), "seed": self.seed, "env_id": self.env_id, "feedback": feedback}

    def prompt(self, template: str, feedback: str | None, **values: object) -> Prompt:
        """Prompt `template` about this environment: its scenario's name and description, `values`,
        and the repair feedback of the previous attempt (if any)."""
        system, user = render(
            template,
            name=self.scenario.name,
            description=self.scenario.description,
            now=self.now,
            acting_user=self.acting_user_line(),
            conventions=self.conventions_lines(),
            feedback=feedback or "",
            **values,
        )
        return Prompt(template, system, user, self.context(feedback))

    def acting_user_line(self) -> str:
        """Who the agent acts as (fixed by the tasks stage), as the prompts state it."""
        return self.tasks.acting_user.line() if self.tasks else "not fixed yet"

    def task_lines(self) -> str:
        """One line per task: its id, instruction and the existing records it names."""
        lines = []
        for task in self.tasks.tasks if self.tasks else []:
            named = f" [existing records: {', '.join(repr(e) for e in task.entities)}]" if task.entities else ""
            lines.append(f"- {task.id}: {task.instruction}{named}")
        return "\n".join(lines)

    def task_texts(self) -> list[str]:
        """The tasks' instructions (what the seed views match the records and tables they name against)."""
        return [task.instruction for task in self.tasks.tasks] if self.tasks else []

    def tool_lines(self) -> str:
        return json.dumps([t.model_dump() for t in self.tool_plan.tools], indent=1) if self.tool_plan else "[]"

    def manifest(
        self, generator: Generator, *, artifacts: dict[str, str] | None = None, stats: dict[str, int] | None = None
    ) -> Manifest:
        """This world's manifest: identity, scenario, clock and provenance (`generator`, the prompts'
        version, the seed), plus its `artifacts`' sha256 and its `stats` where given."""
        info = GeneratorInfo(
            backend=generator.backend, model=generator.model, prompt_version=prompt_version(), seed=self.seed
        )
        return Manifest(
            env_id=self.env_id,
            scenario=self.scenario,
            clock=self.now,
            generator=info,
            artifacts=artifacts or {},
            stats=stats or {},
            conventions=self.conventions,
        )

    def partial_files(self) -> dict[str, bytes]:
        """What the stages of a world that stopped at a stage wrote: each source file it got to, and
        `work.json` (all of this work: the scenario, task list, tool plan and every file so far)."""
        texts = {
            "schema.sql": self.schema_sql,
            "seed.sql": self.seed_sql,
            "tools.py": self.tools_py,
            "verifiers.py": self.verifiers.verifiers_py if self.verifiers else None,
        }
        files = {name: text.encode() for name, text in texts.items() if text}
        files["work.json"] = (self.model_dump_json(indent=2) + "\n").encode()
        return files

    def sources(self) -> dict[str, str]:
        """The source files of the bundle: the five, and `invariants.json` where the schema stated any (all
        stages must have run)."""
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
        if self.invariants:
            files[INVARIANTS_FILE] = invariants_json(self.invariants).decode()
        return files
