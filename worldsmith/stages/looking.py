"""The looks a stage offers the model about the world it builds (llm/looks.py): read-only SQL over the seeded
database, calls of the tools built so far, runs of a reference solution. What answers them here:

- `query_database`: one SELECT or WITH statement (anything else refused, saying so) on a private read-only
  copy of the seed (bundle/readquery.py: a hardened read-only connection, bounded in time and rows);
- `call_tool`: one tool call in the sandbox, on an episode of its own (a throwaway copy of the seed, isolated
  as validation's calls are; nothing it writes reaches the stage's world);
- `run_solution`: a reference solution's calls in order on one such episode, then each call's result and the
  end state's diff from the seed.

The tasks stage can look once a world was built (a later round), the tools stage at the seed from the start
and at its tools once some code of it ran, the verifiers stage at all three. `offer_looks` bounds them by the
settings (`looks_per_attempt`, 0: no looks; `look_answer_chars`; `look_rows`)."""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.readquery import read_queries_on
from worldsmith.bundle.sqlscript import is_one_read
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.llm.backend import Prompt
from worldsmith.llm.looks import LookBudget, LookKind, LookOffer, LookRefused
from worldsmith.runtime.episode import Runtime
from worldsmith.settings import get_settings

#: Seconds one SQL look may run.
QUERY_S = 2.0
#: The most calls of one solution run.
MAX_SOLUTION_STEPS = 30


def look_budget() -> LookBudget:
    """The bounds of looking, from the settings."""
    settings = get_settings()
    return LookBudget(looks=settings.looks_per_attempt, chars=settings.look_answer_chars, rows=settings.look_rows)


def _lines(rows: list[JsonObject]) -> str:
    return "\n".join(json.dumps(row, ensure_ascii=False, default=str) for row in rows)


@dataclass(frozen=True)
class WorldLookout:
    """Answers the looks of one stage attempt at `world` (the seeded database's bytes); with `runtime` and
    `bundle` (the tools built so far on that seed), tool calls; with `solutions` too, solution runs."""

    world: bytes
    budget: LookBudget
    runtime: Runtime | None = None
    bundle: Bundle | None = None
    solutions: bool = False

    @property
    def kinds(self) -> tuple[LookKind, ...]:
        if self.runtime is None or self.bundle is None:
            return (LookKind.QUERY_DATABASE,)
        calls = (LookKind.QUERY_DATABASE, LookKind.CALL_TOOL)
        return (*calls, LookKind.RUN_SOLUTION) if self.solutions else calls

    def answer(self, kind: LookKind, arguments: JsonObject) -> str:
        if kind is LookKind.QUERY_DATABASE:
            return self.query(arguments.get("sql"))
        if kind is LookKind.CALL_TOOL:
            return self.run([{"tool": arguments.get("tool"), "arguments": arguments.get("arguments") or {}}], False)
        steps = arguments.get("steps")
        if not isinstance(steps, list) or not steps:
            raise LookRefused('run_solution needs "steps": a list of {"tool": ..., "arguments": {...}}')
        return self.run(steps[: MAX_SOLUTION_STEPS + 1], True)

    def query(self, sql: JsonValue) -> str:
        """The first rows of one read-only query, as JSON lines (and whether there were more), or its error."""
        if not isinstance(sql, str) or not is_one_read(sql):
            raise LookRefused(
                "query_database answers one SELECT or WITH statement at a time: the database is read-only here "
                "(nothing may be written through a look)"
            )
        [outcome] = read_queries_on(self.world, [sql], max_rows=self.budget.rows, query_s=QUERY_S, total_s=QUERY_S)
        if outcome["error"] is not None:
            if re.search(r"readonly|read-only|not authorized", outcome["error"], re.IGNORECASE):
                raise LookRefused(f"the database is read-only here; the query was refused: {outcome['error']}")
            return f"error: {outcome['error']}"
        rows: list[JsonObject] = [dict(row) for row in outcome["rows"]]
        more = f"\n(more rows than {self.budget.rows}: narrow the query)" if outcome["more"] else ""
        return f"{len(rows)} rows:\n{_lines(rows)}{more}" if rows else "0 rows"

    def run(self, steps: list[JsonValue], solution: bool) -> str:
        """Each step's tool call on one throwaway episode of the bundle, its result; for a solution, the end
        state's diff from the seed after them."""
        assert self.runtime is not None and self.bundle is not None, "tool looks are offered with a bundle"
        names = [tool.name for tool in self.bundle.tools]
        if len(steps) > MAX_SOLUTION_STEPS:
            raise LookRefused(f"at most {MAX_SOLUTION_STEPS} calls a solution run")
        calls: list[tuple[str, JsonObject]] = []
        for step in steps:
            tool = step.get("tool") if isinstance(step, dict) else None
            arguments = (step.get("arguments") or {}) if isinstance(step, dict) else {}
            if not isinstance(tool, str) or tool not in names:
                raise LookRefused(f"no tool {tool!r}; the tools are: {', '.join(names)}")
            if not isinstance(arguments, dict):
                raise LookRefused(f"the arguments of {tool} must be a JSON object")
            calls.append((tool, arguments))
        lines = []
        try:
            with self.runtime.open_episode(self.bundle) as episode:
                before = episode.snapshot() if solution else b""
                for number, (tool, arguments) in enumerate(calls, start=1):
                    result = episode.call_tool(tool, arguments).model_dump_json(exclude_none=True)
                    lines.append(f"call {number} {tool}({json.dumps(arguments)}): {result}" if solution else result)
                if solution:
                    diff = episode.diff(before).model_dump_json(exclude_none=True)
                    lines.append(f"end state's diff from the seed: {diff}")
        except WorldsmithError as exc:  # the sandbox could not run them (a limit, a lost worker)
            lines.append(f"error: the sandbox could not run this: {exc}")
        return "\n".join(lines)


def offer_looks(
    world: bytes | None, runtime: Runtime | None = None, bundle: Bundle | None = None, solutions: bool = False
) -> LookOffer | None:
    """The looks at `world` (and the tools of `bundle`; with `solutions`, solution runs) within the settings'
    bounds; None when there is no world yet or looking is off (`looks_per_attempt` 0)."""
    budget = look_budget()
    if world is None or budget.looks == 0:
        return None
    return LookOffer(WorldLookout(world, budget, runtime, bundle, solutions), budget)


def with_looks(prompt: Prompt, offer: LookOffer | None) -> Prompt:
    """`prompt` offering `offer`'s looks."""
    return dataclasses.replace(prompt, looks=offer)
