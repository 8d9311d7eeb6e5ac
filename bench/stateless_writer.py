"""First-attempt success per stage and repairs per world, against a stateless rule-based writer, with and
without looking (stages/looking.py) in the same run.

    PYTHONPATH=$PWD .venv/bin/python bench/stateless_writer.py [--worlds 3] [--seed 7] [--view-chars 12000]

A local OpenAI-compatible server answers each request from that request alone (nothing kept between
requests), as a stateless model through the `openai` backend would. Its rules, each depending only on
what the request's messages say:

- scenario: it proposes products from a fixed list, famous ones first (some of them seed products),
  skipping every name the request mentions (examples, names listed as taken, names an error says repeat);
- every world stage: the procedural backend's answer for the product the request names (llm/procedural);
- seed: it breaks a foreign key unless the request mentions a FOREIGN KEY failure, and leaves a table
  no tool or task reads empty unless the request names that table's failed `not_empty` expectation;
  it fixes what the request shows, nothing else;
- verifiers: an id argument of a reference solution is used only when the writer saw it: a row of the
  request (`(<id>, ...`), an instruction's `#<id>`, or a look's answer (`"..._id": <id>` or `"id": <id>`);
  any other is guessed as 1. Where the request offers looks (the chat API's `tools`) and ids are unseen,
  its first answer is looks: `call_tool` of the lookup steps (those with no id, before the first unseen
  one) of each such solution, those of the tasks a failure in the request names first, as many as the
  budget allows; the answer after them uses what came back. It asks nothing else.

The pipeline (`build_environment`, the sandbox runtime) builds `--worlds` worlds from the scenarios the
writer proposed, once with looking off (`looks_per_attempt` 0) and once on, the same scenarios and seed.
`--view-chars` bounds the verifiers prompt's seed excerpt (default: the pipeline's own, 12,000 characters): a
smaller one stands for a world whose seed outgrows the excerpt (the issue's worlds had 250-432 rows), the
rows the tasks turn on no longer shown. Prints per arm and stage its invocations, first-attempt success
and mean attempts, per world its failed attempts (repairs asked for) and outcome; the last line is a JSON
object with both arms and the ratio of repairs per world (looking / not).
"""

from __future__ import annotations

import argparse
import functools
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
        self.looks = 0  # looks asked for

    async def completions(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.requests.append(body)
        system, user = body["messages"][0]["content"], body["messages"][1]["content"]
        stage = stage_of(system)
        looked = [m["content"] for m in body["messages"][2:] if m.get("role") == "tool"]
        text = self.answer(stage or "unknown", system, user)
        if stage == "verifiers" and body.get("tools") and not looked:
            lookups = self._lookups(text, user)[: _budget(system)]
            if lookups:
                self.looks += len(lookups)
                return self.completion(body, None, "tool_calls", tool_calls=lookups)
        return self.completion(body, self._verifiers(text, user, looked) if stage == "verifiers" else text, "stop")

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

    def _verifiers(self, text: str, user: str, looked: list[str]) -> str:
        answer = json.loads(text)
        for solution in answer["solutions"]:
            for step in solution["solution"]:
                for key, value in step["arguments"].items():
                    if _names_id(key, value) and not _seen(value, user, looked):
                        step["arguments"][key] = 1  # a guess: the row is nowhere in the request
        return json.dumps(answer)

    def _lookups(self, text: str, user: str) -> list[tuple[str, dict[str, Any]]]:
        """The `call_tool` looks of the lookup steps before each solution's first unseen id (see the docstring)."""
        calls: list[tuple[str, dict[str, Any]]] = []
        solutions = json.loads(text)["solutions"]  # those of the tasks a failure names first (a repair's)
        solutions.sort(key=lambda s: not re.search(rf"for task {re.escape(s['task_id'])}\b", user))
        for solution in solutions:
            steps = solution["solution"]
            unseen = [
                n
                for n, step in enumerate(steps)
                if any(_names_id(k, v) and not _seen(v, user, []) for k, v in step["arguments"].items())
            ]
            if not unseen:
                continue
            for step in steps[: unseen[0]]:
                call = ("call_tool", {"tool": step["tool"], "arguments": step["arguments"]})
                if not any(_names_id(k, v) for k, v in step["arguments"].items()) and call not in calls:
                    calls.append(call)
        return calls


def _names_id(key: str, value: Any) -> bool:
    return (key == "id" or key.endswith("_id")) and isinstance(value, int)


def _seen(value: int, user: str, looked: list[str]) -> bool:
    """Whether id `value` is in a row of the request, an instruction's `#<id>` or a look's answer."""
    if f"({value}, " in user or re.search(rf"#{value}\b", user):
        return True
    return any(re.search(rf'"\w*id":\s*{value}\b', answer) for answer in looked)


def _budget(system: str) -> int:
    """The looks the request allows (`at most N looks`)."""
    found = re.search(r"at most (\d+) looks", system)
    return int(found.group(1)) if found else 0


def build_arm(
    label: str, scenarios: list[Scenario], looks: int, writer: StatelessWriter, url: str, args: argparse.Namespace
) -> dict[str, Any]:
    """Build every scenario's world with `looks` looks per attempt (0: looking off); print and return the counts."""
    from worldsmith.llm.openai_backend import OpenAIGenerator
    from worldsmith.runtime.episode import Runtime
    from worldsmith.settings import get_settings
    from worldsmith.stages.attempts import AttemptLog, stage_summary
    from worldsmith.stages.pipeline import build_environment

    os.environ["WORLDSMITH_LOOKS_PER_ATTEMPT"] = str(looks)
    get_settings.cache_clear()
    requests, asked = len(writer.requests), writer.looks
    log = AttemptLog(f"stateless-writer-{label}")
    generator = OpenAIGenerator(
        model="stateless-writer", base_url=f"{url}/v1", api_key="sk-bench", timeout_s=120, retries=1
    )
    outcomes = []
    print(f"--- {label} (looks_per_attempt {looks})")
    with Runtime() as runtime:
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
    made = len(writer.requests) - requests
    print(
        f"worlds good {sum(o['good'] for o in outcomes)}/{len(outcomes)}; repairs per world {per_world:.1f}; "
        f"requests {made}; looks {writer.looks - asked}"
    )
    return {
        "worlds": outcomes,
        "stages": {r["stage"]: r["first_attempt_success"] for r in summary},
        "repairs_per_world": per_world,
        "requests": made,
        "looks": writer.looks - asked,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--max-attempts", type=int, default=5)
    parser.add_argument("--looks", type=int, default=8, help="looks per attempt of the looking arm")
    parser.add_argument("--view-chars", type=int, default=None, help="the verifiers prompt's seed excerpt, characters")
    args = parser.parse_args()

    import worldsmith
    from worldsmith.llm.openai_backend import OpenAIGenerator
    from worldsmith.stages import verifiers
    from worldsmith.stages.attempts import AttemptLog
    from worldsmith.stages.repair import StageFailed
    from worldsmith.stages.scenario import expand_scenarios, load_scenarios

    print(f"worldsmith from {Path(worldsmith.__file__).parent}")
    if args.view_chars is not None:  # a world whose seed outgrows the excerpt (see the docstring)
        verifiers.seed_view = functools.partial(verifiers.seed_view, limit=args.view_chars)  # type: ignore[assignment]
    writer = StatelessWriter(args.seed)
    with writer.serve() as background:
        generator = OpenAIGenerator(
            model="stateless-writer", base_url=f"{background.url}/v1", api_key="sk-bench", timeout_s=120, retries=1
        )
        seeds = load_scenarios(None)
        try:
            log = AttemptLog("stateless-writer-scenarios")
            scenarios = expand_scenarios(seeds, args.worlds, generator, log, max_attempts=args.max_attempts)
        except StageFailed as failed:  # the worlds are then the writer's products no seed is named as
            print(f"scenario stage failed: {failed}")
            taken = {s.name for s in seeds}
            fresh = [p for p in PRODUCTS if p[0] not in taken][: args.worlds]
            scenarios = [Scenario(name=n, description=d, categories=[c]) for n, d, c in fresh]
        arms = {
            "without_looks": build_arm("without looks", scenarios, 0, writer, background.url, args),
            "with_looks": build_arm("with looks", scenarios, args.looks, writer, background.url, args),
        }
    before, after = arms["without_looks"]["repairs_per_world"], arms["with_looks"]["repairs_per_world"]
    ratio = after / before if before else None
    print(
        f"repairs per world: {before:.1f} without looks, {after:.1f} with; ratio {ratio if ratio is None else round(ratio, 2)}"
    )
    print(json.dumps({**arms, "repairs_ratio": ratio, "view_chars": args.view_chars}))


if __name__ == "__main__":
    main()
