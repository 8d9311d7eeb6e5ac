"""The `procedural` generator backend: offline, no network, deterministic for a given seed.

It answers each stage's request with the matching slice of a world composed from building
blocks (see compose.py), in the stage's spec, as JSON text decoded by the same path as LLM
output. With `fault_rate` > 0, a stage's first attempt fails the way LLM output fails (bad JSON,
truncation, SQL errors, a seed row breaking a foreign key, tool code that raises, a verifier that
accepts the untouched state); once the error is fed back (context["feedback"]), it answers right.
With `persistent_fault_rate` > 0, that share of worlds gets a fault no repair fixes: every answer to
their seed request keeps a row pointing at a parent that does not exist (another one each time), so
the world fails at stage database:seed after its attempts, with a failure to open.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from datetime import date, datetime
from functools import lru_cache

from faker import Faker

from worldsmith.bundle.clock import world_clock
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.invariants import INVARIANTS_FILE, invariants_json
from worldsmith.bundle.loader import build_bundle
from worldsmith.bundle.toolspec import derive_tool_schemas
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.llm.backend import Generation, Prompt, PromptContext, Spec, Usage, decode
from worldsmith.llm.procedural.blocks import DOMAINS
from worldsmith.llm.procedural.compose import compose
from worldsmith.llm.procedural.conventions import conventions_of
from worldsmith.llm.procedural.drafts import WorldDraft
from worldsmith.llm.procedural.mapping import domain_for, domains_to_expand
from worldsmith.models.bundle import Scenario

MODEL = "procedural-v1"


@lru_cache(maxsize=64)
def _world(domain_key: str, seed: int, variety: str | None = None, today: date | None = None) -> WorldDraft:
    domain = next(d for d in DOMAINS if d.key == domain_key)
    return compose(domain, seed, variety, today)


def world_for(scenario: Scenario, seed: int) -> WorldDraft:
    """The world of `scenario`: a variant of its domain drawn from its name and `seed` (compose.py), its
    data dated around the world's clock (bundle/clock.py: the day the pipeline records as its "now")."""
    today = datetime.fromisoformat(world_clock(scenario, seed)).date()
    return _world(domain_for(scenario).key, seed, scenario.name, today)


def procedural_bundle(domain_key: str, seed: int) -> Bundle:
    """The composed world of `domain_key` as a bundle, without the generation pipeline (for tests,
    benchmarks and suites that need many valid worlds quickly)."""
    world = _world(domain_key, seed)
    tasks = "".join(
        json.dumps(
            {
                "id": t.id,
                "instruction": t.instruction,
                "verifier": f"verify_{t.id}",
                "solution": [step.model_dump() for step in t.solution],
                "answer": t.answer,
            }
        )
        + "\n"
        for t in world.tasks
    )
    sources = {
        "schema.sql": world.schema_sql,
        "seed.sql": world.seed_sql,
        "tools.py": world.tools_py,
        "tasks.jsonl": tasks,
        "verifiers.py": world.verifiers_py,
        INVARIANTS_FILE: invariants_json(world.invariants).decode(),
    }
    domain = next(d for d in DOMAINS if d.key == domain_key)
    return build_bundle(sources, {"env_id": f"{domain_key}_{seed}", "scenario": {"name": domain.title}})


def _chance(*parts: object) -> float:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).hexdigest()
    return int(digest[:8], 16) / 0xFFFFFFFF


class ProceduralGenerator:
    """Answers stage requests from composed worlds; see the module docstring."""

    backend = "procedural"
    model = MODEL

    def __init__(self, *, seed: int = 0, fault_rate: float = 0.0, persistent_fault_rate: float = 0.0):
        self.seed = seed
        self.fault_rate = fault_rate
        self.persistent_fault_rate = persistent_fault_rate

    # -- correct answers ------------------------------------------------------------------
    def _scenarios(self, context: PromptContext) -> JsonObject:
        examples = [Scenario.model_validate(s) for s in context.get("examples", [])]
        count = int(context.get("count", 1))
        rng = random.Random(f"{self.seed}:{context.get('round', 0)}")
        fake = Faker("en_US")
        fake.seed_instance(rng.randint(0, 2**31))
        domains = domains_to_expand(examples, rng)
        scenarios: list[JsonValue] = []
        for index in range(count):
            domain = domains[index % len(domains)]  # balanced across the seeds' domains
            company = fake.company()
            entities = [e for e in domain.entities]
            rng.shuffle(entities)
            verbs = [f"{t.phrase} {e.table.replace('_', ' ')}" for e in entities for t in e.transitions][:4]
            description = (
                f"{company} runs a {domain.title.lower()} platform based in {fake.city()}. "
                f"Users manage {', '.join(e.table.replace('_', ' ') for e in entities[:3])} and more. "
                f"Common operations: {'; '.join(verbs)}. {fake.catch_phrase()}."
            )
            scenarios.append(
                {"name": f"{company} {domain.title}", "description": description, "categories": [domain.key]}
            )
        return {"scenarios": scenarios}

    def _answer(self, prompt: Prompt) -> JsonObject:
        context = prompt.context
        if prompt.stage == "scenario":
            return self._scenarios(context)
        world = world_for(Scenario.model_validate(context["scenario"]), int(context.get("seed", self.seed)))
        if prompt.stage == "tasks":
            return {
                "acting_user": {"role": f"{world.domain.title.lower()} operator", "identifier": None},
                "tasks": [
                    {"id": t.id, "instruction": t.instruction, "entities": list(t.entities)} for t in world.tasks
                ],
            }
        if prompt.stage == "schema":
            return {
                "schema_sql": world.schema_sql,
                "conventions": conventions_of(world).model_dump(),
                "invariants": [i.model_dump() for i in world.invariants],
            }
        if prompt.stage == "seed":
            return {"seed_sql": world.seed_sql}
        if prompt.stage == "tool_plan":
            tools, _ = derive_tool_schemas(world.tools_py)
            return {"tools": list(tools)}
        if prompt.stage == "tool_code":
            return {"tools_py": world.tools_py}
        if prompt.stage == "verifiers":
            return {
                "verifiers_py": world.verifiers_py,
                "solutions": [
                    {"task_id": t.id, "solution": [step.model_dump() for step in t.solution], "answer": t.answer}
                    for t in world.tasks
                ],
            }
        if prompt.stage == "review":  # a composed world has no bug to report
            return {"findings": []}
        raise ValueError(f"the procedural backend has no answer for stage {prompt.stage!r}")

    # -- faults ---------------------------------------------------------------------------
    def _faulty(self, stage: str, answer: JsonObject, missing_parent: int = 9999) -> str:
        """The answer as a first LLM attempt might get it wrong, as text (a seed row pointing at parent
        `missing_parent`, which does not exist)."""
        text = json.dumps(answer)
        if stage in ("scenario", "tasks", "tool_plan"):
            return text[: len(text) * 2 // 3]  # truncated JSON
        if stage == "schema":
            answer["schema_sql"] = str(answer["schema_sql"]).replace(
                "CREATE TABLE audit_log", "CREATE TABEL audit_log", 1
            )
        elif stage == "seed":  # a child row pointing at a parent that does not exist
            answer["seed_sql"] = re.sub(
                r"(INSERT INTO \w+ \(id, (\w+_id),.*?VALUES\n    \(1, )(\d+)",
                rf"\g<1>{missing_parent}",
                str(answer["seed_sql"]),
                count=1,
                flags=re.DOTALL,
            )
        elif stage == "tool_code":  # a tool that crashes on every call
            answer["tools_py"] = re.sub(
                r"(def get_\w+\(conn, \w+: int\) -> dict \| list:\n    \"\"\"[^\"]*\"\"\"\n)",
                r"\g<1>    return conn.execute('SELECT no_such_column FROM world_settings').fetchall()\n",
                str(answer["tools_py"]),
                count=1,
            )
        elif stage == "verifiers":  # a verifier that accepts the untouched state
            answer["verifiers_py"] = re.sub(
                r"(def verify_\w+\(initial, final, answer\):\n)",
                r"\g<1>    return _result('complete')\n",
                str(answer["verifiers_py"]),
                count=1,
            )
        return json.dumps(answer)

    def persistent_fault(self, prompt: Prompt) -> bool:
        """Whether `prompt` is a seed request of a world whose seed fault survives every repair (a share
        `persistent_fault_rate` of worlds, drawn from the scenario's name and the seed)."""
        name = prompt.context.get("scenario", {}).get("name")
        return (
            prompt.stage == "seed"
            and self.persistent_fault_rate > 0
            and _chance(self.seed, name, "persistent") < self.persistent_fault_rate
        )

    def answer_text(self, prompt: Prompt, *, fault: bool | None = None) -> str:
        """The model-like text answer to `prompt`: faulty on a first attempt with probability
        `fault_rate` (or exactly when `fault` says so), and on every attempt of a `persistent_fault`."""
        answer = self._answer(prompt)
        context = prompt.context
        if fault is None and self.persistent_fault(prompt):  # the parent it points at moves with the feedback
            moved = int(hashlib.sha256(str(context.get("feedback")).encode()).hexdigest()[:4], 16) % 900
            return self._faulty(prompt.stage, answer, missing_parent=9000 + moved)
        if fault is None:
            first_try = not context.get("feedback")
            fault = (
                first_try
                and self.fault_rate > 0
                and _chance(self.seed, context.get("scenario", {}).get("name"), prompt.stage) < self.fault_rate
            )
        return self._faulty(prompt.stage, answer) if fault else json.dumps(answer)

    def generate(self, prompt: Prompt, spec: type[Spec]) -> Generation[Spec]:
        text = self.answer_text(prompt)
        usage = Usage(calls=1, tokens_in=(len(prompt.system) + len(prompt.user)) // 4, tokens_out=len(text) // 4)
        return Generation(decode(text, spec, usage), usage, text)
