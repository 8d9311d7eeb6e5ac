"""First-attempt success per stage and repairs per world, against a stateless rule-based writer.

    PYTHONPATH=$PWD .venv/bin/python bench/stateless_writer.py [--worlds 3] [--seed 7]
    PYTHONPATH=/work/main .venv/bin/python bench/stateless_writer.py   # the same writer against main's code

A local OpenAI-compatible server answers each request from that request alone (nothing kept between
requests), as a stateless model through the `openai` backend would. Its rules, each depending only on
what the request's messages say:

- scenario: it proposes products from a fixed list, famous ones first (some of them seed products),
  skipping every name the request mentions (examples, names listed as taken, names an error says repeat);
- every world stage: the procedural backend's answer for the product the request names (llm/procedural);
- seed: it breaks a foreign key unless the request mentions a FOREIGN KEY failure, and leaves a table
  no tool or task reads empty unless the request names that table's failed `not_empty` expectation;
  it fixes what the request shows, nothing else;
- verifiers: an id argument of a reference solution that no row of the request shows (`(<id>, ...`)
  is guessed as 1.

The pipeline (`build_environment`, the sandbox runtime) builds `--worlds` worlds from the scenarios the
writer proposed. Prints per stage its invocations, first-attempt success and mean attempts, per world
its failed attempts (repairs asked for) and outcome; the last line is a JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the tests' OpenAI-compatible server; worldsmith from PYTHONPATH
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")

from starlette.requests import Request  # noqa: E402
from starlette.responses import JSONResponse  # noqa: E402
from support.llm_server import ScriptedLLM  # noqa: E402

from worldsmith.llm.backend import Prompt  # noqa: E402
from worldsmith.llm.procedural.backend import ProceduralGenerator, world_for  # noqa: E402
from worldsmith.llm.prompts import scenario_lines, stage_of  # noqa: E402
from worldsmith.models.bundle import Scenario  # noqa: E402

#: The writer's products, famous ones first (the first four are seed products of worldsmith/data).
PRODUCTS: tuple[tuple[str, str, str], ...] = (
    ("Airbnb", "Guests book stays at hosts' homes and leave reviews; hosts manage listings.", "travel"),
    ("Zillow", "Buyers browse homes for sale, save searches and contact agents about listings.", "real estate"),
    ("Stripe", "Merchants take card payments, issue refunds and manage customer subscriptions.", "finance"),
    ("Uber", "Riders request trips, drivers accept them, and riders pay and rate the drivers.", "travel"),
    (
        "Harbor Kennel Club",
        "Pet owners book kennel stays and grooming appointments for their dogs, pay deposits and "
        "cancel bookings; staff check pets in and out.",
        "pets",
    ),
    (
        "Maple Lane Tutoring",
        "Students enrol in tutoring courses, book lessons with instructors, submit assignments and get "
        "grades; instructors publish course material.",
        "education",
    ),
    (
        "Ridgeline Bike Rentals",
        "Customers rent bikes by the hour from city stations, extend or end rentals and report damage; "
        "staff move bikes between stations.",
        "travel",
    ),
    (
        "Copperpot Meal Kits",
        "Customers order weekly meal kits, pick recipes, skip deliveries and apply promo codes; the "
        "kitchen ships orders and handles refunds.",
        "retail",
    ),
    (
        "Lantern Clinic Portal",
        "Patients book appointments with doctors, refill prescriptions and message the clinic; doctors "
        "write visit notes and lab orders.",
        "health",
    ),
)


def _mentioned(name: str, text: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(name.casefold())}(?!\w)", text.casefold()) is not None


def _leaf_table(world: Any) -> str | None:
    """A table no other table references and no tool or verifier reads (leaving it empty breaks only the
    seed-data expectations, which validation checks); None when every table is read."""
    code = world.tools_py + world.verifiers_py
    tables = re.findall(r"CREATE TABLE (\w+)", world.schema_sql)
    unread = (
        t
        for t in tables
        if not re.search(rf"(FROM|JOIN)\s+\"?{t}\b", code) and not re.search(rf"REFERENCES {t}\b", world.schema_sql)
    )
    return next(unread, None)


class StatelessWriter(ScriptedLLM):
    """The rule-based writer of the module docstring, as an OpenAI-compatible server."""

    def __init__(self, seed: int):
        super().__init__()
        self.seed = seed
        self.generator = ProceduralGenerator(seed=seed)

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        stage = stage_of(system.split("\n\nAnswer with one JSON object")[0]) or "unknown"
        return self.completion(body, self.answer(stage, system, user), "stop")

    def answer(self, stage: str, system: str, user: str) -> str:
        if stage == "scenario":
            wanted = re.search(r"Propose (\d+) new", user)
            count = int(wanted.group(1)) if wanted else 1
            fresh = [p for p in PRODUCTS if not _mentioned(p[0], user)][:count] or list(PRODUCTS[:count])
            return json.dumps({"scenarios": [{"name": n, "description": d, "categories": [c]} for n, d, c in fresh]})
        name, description = scenario_lines(user)
        scenario = Scenario(name=name, description=description)
        context: dict[str, Any] = {"scenario": scenario.model_dump(), "seed": self.seed}
        text = self.generator.answer_text(Prompt(stage, system, user, context), fault=False)  # type: ignore[arg-type]
        if stage == "seed":
            return self._seed(world_for(scenario, self.seed), user)
        if stage == "verifiers":
            return self._verifiers(text, user)
        return text

    def _seed(self, world: Any, user: str) -> str:
        sql = world.seed_sql
        if "FOREIGN KEY" not in user:  # a child row pointing at a parent that does not exist
            sql = re.sub(
                r"(INSERT INTO \w+ \(id, (\w+_id),.*?VALUES\n    \(1, )(\d+)",
                r"\g<1>9999",
                sql,
                count=1,
                flags=re.DOTALL,
            )
        leaf = _leaf_table(world)
        if leaf is not None and f"{leaf} not_empty" not in user:
            statements = re.split(r"(?<=;)\n", sql)
            sql = "\n".join(s for s in statements if not re.match(rf"\s*INSERT INTO \"?{leaf}\b", s))
        return json.dumps({"seed_sql": sql})

    def _verifiers(self, text: str, user: str) -> str:
        answer = json.loads(text)
        for solution in answer["solutions"]:
            for step in solution["solution"]:
                for key, value in step["arguments"].items():
                    named_id = key == "id" or key.endswith("_id")
                    if named_id and isinstance(value, int) and f"({value}, " not in user:
                        step["arguments"][key] = 1  # a guess: the row is nowhere in the request
        return json.dumps(answer)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-attempts", type=int, default=5)
    args = parser.parse_args()

    import worldsmith
    from worldsmith.llm.openai_backend import OpenAIGenerator
    from worldsmith.runtime.episode import Runtime
    from worldsmith.stages.attempts import AttemptLog, stage_summary
    from worldsmith.stages.pipeline import build_environment
    from worldsmith.stages.repair import StageFailed
    from worldsmith.stages.scenario import expand_scenarios, load_scenarios

    print(f"worldsmith from {Path(worldsmith.__file__).parent}")
    writer = StatelessWriter(args.seed)
    log = AttemptLog("stateless-writer")
    outcomes = []
    with writer.serve() as background, Runtime() as runtime:
        generator = OpenAIGenerator(
            model="stateless-writer", base_url=f"{background.url}/v1", api_key="sk-bench", timeout_s=120, retries=1
        )
        seeds = load_scenarios(None)
        try:
            scenarios = expand_scenarios(seeds, args.worlds, generator, log, max_attempts=args.max_attempts)
        except StageFailed as failed:  # the worlds are then the writer's products no seed is named as
            print(f"scenario stage failed: {failed}")
            taken = {s.name for s in seeds}
            fresh = [p for p in PRODUCTS if p[0] not in taken][: args.worlds]
            scenarios = [Scenario(name=n, description=d, categories=[c]) for n, d, c in fresh]
        for scenario in scenarios:
            result = build_environment(scenario, args.seed, generator, runtime, log, max_attempts=args.max_attempts)
            mine = [a for a in log.attempts if a.env_id == result.env_id]
            failed = sum(1 for a in mine if a.outcome == "failure")
            outcomes.append({"world": scenario.name, "good": result.good, "repairs": failed, "attempts": len(mine)})
            print(
                f"{scenario.name}: {'good' if result.good else 'FAILED at ' + str(result.failed_stage)}, "
                f"{failed} failed attempts (validation rounds included)"
            )
    summary = stage_summary(log.attempts)
    print(f"{'stage':<18} {'runs':>5} {'first ok':>9} {'mean attempts':>14}")
    for row in summary:
        print(
            f"{row['stage']:<18} {row['invocations']:>5} {row['first_attempt_success']:>9.2f} {row['mean_attempts']:>14.2f}"
        )
    per_world = sum(o["repairs"] for o in outcomes) / max(len(outcomes), 1)
    print(
        f"worlds good {sum(o['good'] for o in outcomes)}/{len(outcomes)}; repairs per world {per_world:.1f}; "
        f"requests {len(writer.requests)}"
    )
    print(
        json.dumps(
            {
                "worlds": outcomes,
                "stages": {r["stage"]: r["first_attempt_success"] for r in summary},
                "repairs_per_world": per_world,
                "requests": len(writer.requests),
            }
        )
    )


if __name__ == "__main__":
    main()
