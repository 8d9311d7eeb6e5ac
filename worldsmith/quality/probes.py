"""Execution probes of an environment: its tools run (once here, then on many valid and invalid
inputs: quality/deep_probes.py), its tasks are not blocked, its reference solutions are accepted,
its untouched state is rejected, its replay is deterministic (under another real clock and other
random seeds), its verifiers judge mutated end states right (quality/verifier_mutations.py). `worldsmith env check` prints them; what a failure is, and whose, is typed
(quality/probe_results.py)."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worldsmith.bundle.contract import Bundle
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import DbDiff, ToolResult, VerifierResult
from worldsmith.quality.concurrently import each_on_pool, together
from worldsmith.quality.input_formats import EXAMPLES, conforming, declared_format
from worldsmith.quality.json_schema import schema_list, schema_object
from worldsmith.quality.memo import SharedMemo
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.runtime.episode import Episode, Runtime
from worldsmith.runtime.errors import RuntimeFault


class SeedValues:
    """Plausible argument values taken from the seeded database, by column name (the first found,
    or a random one when given `rng`)."""

    def __init__(self, world: bytes, rng: random.Random | None = None):
        self.rng = rng
        conn = sqlite3.connect(":memory:")
        conn.deserialize(world)
        self.columns: dict[str, list[Any]] = {}
        tables = [
            r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%'")
        ]
        for table in tables:
            cursor = conn.execute(f'SELECT * FROM "{table}" LIMIT 5')
            names = [d[0] for d in cursor.description]
            for row in cursor.fetchall():
                for name, value in zip(names, row):
                    if value is not None:
                        self.columns.setdefault(name, []).append(value)
                        if name == "id":
                            self.columns.setdefault(f"{table.rstrip('s')}_id", []).append(value)
        conn.close()

    def value(self, name: str, schema: Mapping[str, JsonValue]) -> Any:
        if examples := schema_list(schema, "examples"):  # documented example values (FastAPI apps carry them) first
            return examples[0]
        if "example" in schema:
            return schema["example"]
        if "enum" in schema:
            return schema_list(schema, "enum")[0]
        kinds = schema.get("type", "string")
        kind = next((k for k in kinds if k != "null"), "string") if isinstance(kinds, list) else kinds
        kind = kind if isinstance(kind, str) else ""  # not a type name: no column fits, "test"
        python_types: dict[str, type | tuple[type, ...]] = {
            "integer": int,
            "number": (int, float),
            "string": str,
            "boolean": bool,
        }
        wanted = python_types.get(kind)
        candidates = [
            c
            for c in self.columns.get(name, [])
            if wanted and isinstance(c, wanted) and not isinstance(c, bool) or kind == "boolean" and isinstance(c, bool)
        ]
        candidates = conforming(candidates, schema, name)
        if not candidates and (form := declared_format(schema, name)) is not None:  # any value of its format
            seen = (v for values in self.columns.values() for v in values if isinstance(v, str))
            candidates = conforming(seen, schema, name)[:1] or [EXAMPLES[form]]
        if candidates:
            return self.rng.choice(candidates) if self.rng else candidates[0]
        return {"integer": 1, "number": 1.0, "string": "test", "boolean": True, "array": [], "object": {}}.get(
            kind, "test"
        )


def sample_arguments(tool: Mapping[str, JsonValue], seeds: SeedValues) -> JsonObject:
    """Arguments for every required parameter of `tool` (a tools.json entry), drawn from the seed data where
    possible."""
    params = schema_object(tool, "parameters")
    properties = schema_object(params, "properties")
    schemas = {name: properties[name] for name in schema_list(params, "required") if isinstance(name, str)}
    return {name: seeds.value(name, schema if isinstance(schema, dict) else {}) for name, schema in schemas.items()}


def probe_tools(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """Every tool runs: called with the arguments of a reference solution, else with seed-data
    arguments. A refusal (tool_error) counts as running; an env_error does not."""
    calls: dict[str, JsonObject] = {}
    for task in bundle.tasks:
        for step in task.solution:
            calls.setdefault(step.tool, step.arguments)
    seeds = SeedValues(bundle.world)
    results = []
    try:
        episode = runtime.open_episode(bundle)
    except RuntimeFault as exc:  # the tool module (or app) does not load: no tool can run
        return [ProbeResult.failing(ProbeFailure.TOOLS_DO_NOT_LOAD, bundle.env_id, str(exc))]
    with episode:
        for tool in bundle.tools:
            arguments = calls.get(tool.name) or sample_arguments(tool.model_dump(), seeds)
            outcome = episode.call_tool(tool.name, arguments)
            if outcome.status != "env_error":
                results.append(ProbeResult.passing(Probe.TOOL_RUNS, tool.name, outcome.status))
            else:
                results.append(ProbeResult.quoting(ProbeFailure.TOOL_CRASHED, tool.name, f"{outcome.error}", outcome))
    return results


#: How far the determinism probe's second replay shifts every real-time source its code can read past
#: the world's frozen clock (`time.monotonic`, `perf_counter`...; see worldsmith/runtime/sandbox/worldclock.py):
#: a day, an hour, a minute and a half second, so reads cut to any of those units differ too.
REPLAY_CLOCK_SKEW_S = 86_400 + 3_600 + 60 + 0.5
_DIFFERS = "differs between two replays (real clock shifted, other random seed)"
_EXCERPT = 200


@dataclass
class SolutionReplay:
    """One replay of a task's reference solution from the untouched world: each step's outcome and, after a
    writing step, the database; the verdict (None when a step failed) on the end state with `answer`; the end
    state; why it is not accepted (a failed `Probe.REFERENCE_ACCEPTED`; None: it is)."""

    steps: list[tuple[ToolResult, bytes | None]]
    verdict: VerifierResult | None
    answer: str
    final: bytes
    rejection: ProbeResult | None


def _replay(runtime: Runtime, bundle: Bundle, task: TaskSpec, clock_skew_s: float) -> SolutionReplay:
    """Run `task`'s reference solution in a fresh episode (its own random seeds, the real clock of its
    code shifted by `clock_skew_s`), then its verifier."""
    steps: list[tuple[ToolResult, bytes | None]] = []
    rejection = None
    verdict = None
    answer = task.answer or ""
    with runtime.open_episode(bundle, task, clock_skew_s=clock_skew_s) as episode:
        for number, step in enumerate(task.solution, start=1):
            outcome = episode.call_tool(step.tool, step.arguments)
            steps.append((outcome, episode.snapshot() if outcome.ok and outcome.changed else None))
            if not outcome.ok:
                crashed = outcome.status == "env_error"
                failure = ProbeFailure.REFERENCE_STEP_CRASHED if crashed else ProbeFailure.REFERENCE_STEP_REFUSED
                where = f"step {number} ({step.tool})"
                detail = f"{where} gave {outcome.status}: {outcome.error}"
                rejection = ProbeResult.quoting(failure, task.id, detail, outcome, where)
                break
        if rejection is None:
            verdict = episode.verify(answer)
            if verdict.status != "complete":
                detail = f"verifier said {_status(verdict)}: {verdict.error or verdict.evidence}"
                rejection = ProbeResult.quoting(
                    ProbeFailure.REFERENCE_REJECTED, task.id, detail, verdict, f"verifier {task.verifier}"
                )
        final = episode.snapshot()
    return SolutionReplay(steps, verdict, answer, final, rejection)


def _status(verdict: VerifierResult) -> str:
    return str(getattr(verdict.status, "value", verdict.status))


def excerpt(value: Any) -> str:
    """`value` as text (JSON unless a string), cut to about `_EXCERPT` characters: how probes quote it."""
    text = value if isinstance(value, str) else json.dumps(value, default=str, sort_keys=True)
    return text if len(text) <= _EXCERPT else text[: _EXCERPT - 3] + "..."


def _shown(outcome: ToolResult) -> str:
    return excerpt(outcome.value) if outcome.ok else f"{outcome.status}: {excerpt(outcome.error or '')}"


def _changes(changes: DbDiff) -> str:
    """The first difference of `changes` (from the first replay's database to the second's), in words."""
    table, rows = next(iter(changes.tables.items()))
    if rows.updated:
        update = rows.updated[0]
        before, after = update.get("before") or {}, update.get("after") or {}
        columns = [c for c in after if before.get(c) != after.get(c)]
        shown = ", ".join(f"{c} {excerpt(before.get(c))} vs {excerpt(after.get(c))}" for c in columns[:3])
        return f"{table} row {excerpt(update.get('key'))}: {shown}"
    if rows.inserted:
        return f"{table}: a row only in the second replay: {excerpt(rows.inserted[0])}"
    return f"{table}: a row only in the first replay: {excerpt(rows.deleted[0])}"


def _first_difference(
    episode: Episode, task: TaskSpec, first: SolutionReplay, second: SolutionReplay
) -> ProbeResult | None:
    """What first differs between two replays of `task`'s reference solution, as a failed
    `Probe.REPLAY_DETERMINISTIC` naming the tool (or the verifier) at fault: its cause and the start of
    its detail are "tool NAME (step N)", "verifier NAME" or "end state". None when they agree.
    `episode` (any open episode) compares databases."""
    for number, (step, (a, a_state), (b, b_state)) in enumerate(zip(task.solution, first.steps, second.steps), start=1):
        where = f"tool {step.tool} (step {number})"
        if (a.status, a.value, a.error, a.changed) != (b.status, b.value, b.error, b.changed):
            detail = f"{where}: its result {_DIFFERS}: {_shown(a)} vs {_shown(b)}"
            quoted = a if a.limit else b  # the result that broke a sandbox limit, if either did
            return ProbeResult.quoting(ProbeFailure.REPLAY_DIFFERS_IN_TOOL, task.id, detail, quoted, where)
        if a_state != b_state and a_state is not None and b_state is not None:
            changes = episode.diff(a_state, b_state)
            if not changes.empty:
                detail = f"{where}: the database after it {_DIFFERS}: {_changes(changes)}"
                return ProbeResult.failing(ProbeFailure.REPLAY_DIFFERS_IN_TOOL, task.id, detail, cause=where)
    if first.verdict is not None and second.verdict is not None and _status(first.verdict) != _status(second.verdict):
        where = f"verifier {task.verifier}"
        detail = f"{where}: its verdict {_DIFFERS}: {_status(first.verdict)} vs {_status(second.verdict)}"
        return ProbeResult.failing(ProbeFailure.REPLAY_DIFFERS_IN_VERIFIER, task.id, detail, cause=where)
    if first.final != second.final:
        changes = episode.diff(first.final, second.final)
        if not changes.empty:
            detail = f"end state: the database {_DIFFERS}: {_changes(changes)}"
            return ProbeResult.failing(ProbeFailure.REPLAY_DIFFERS_IN_END_STATE, task.id, detail, cause="end state")
    return None


def probe_tasks(runtime: Runtime, bundle: Bundle) -> list[ProbeResult]:
    """Per task: the reference solution runs and is judged complete; the untouched database is
    judged not complete; a second replay of the solution, with another random seed for every call
    and every real-time source its code can read shifted (`REPLAY_CLOCK_SKEW_S`), gives the same
    results, databases and verdict (`Probe.REPLAY_DETERMINISTIC`, naming the first tool whose result or
    database differs)."""
    return task_probes(runtime, bundle)[0]


def task_probes(runtime: Runtime, bundle: Bundle) -> tuple[list[ProbeResult], dict[str, SolutionReplay]]:
    """`probe_tasks`' results (several tasks at once on the runtime's pool), and the first replay of each
    reference solution by task id, for the probes that build on its end state (verifier mutations)."""
    probed = each_on_pool(runtime, bundle.tasks, lambda task: _task_probes(runtime, bundle, task))
    replays = {task.id: replay for task, (_, replay) in zip(bundle.tasks, probed) if replay is not None}
    return [result for results, _ in probed for result in results], replays


def _task_probes(runtime: Runtime, bundle: Bundle, task: TaskSpec) -> tuple[list[ProbeResult], SolutionReplay | None]:
    """`probe_tasks`' results of one task, and its first replay (None: it has no reference solution)."""
    results = []
    first = second = None
    if task.solution:  # imported environments may have none
        first = _replay(runtime, bundle, task, 0.0)
        results.append(first.rejection or ProbeResult.passing(Probe.REFERENCE_ACCEPTED, task.id, "complete"))
        if first.rejection is None:
            second = _replay(runtime, bundle, task, REPLAY_CLOCK_SKEW_S)
    with runtime.open_episode(bundle, task) as episode:
        results.append(_untouched(task, episode.verify("")))
        if first is not None and second is not None:
            difference = _first_difference(episode, task, first, second)
            results.append(
                difference or ProbeResult.passing(Probe.REPLAY_DETERMINISTIC, task.id, "same results and database")
            )
    return results, first


def _untouched(task: TaskSpec, untouched: VerifierResult) -> ProbeResult:
    """`Probe.UNTOUCHED_REJECTED` of `task`, given the verdict on its untouched database."""
    status = _status(untouched)
    if status in ("incomplete", "partial"):
        return ProbeResult.passing(Probe.UNTOUCHED_REJECTED, task.id, status)
    failure = ProbeFailure.UNTOUCHED_ACCEPTED if status == "complete" else ProbeFailure.UNTOUCHED_VERIFIER_CRASHED
    return ProbeResult.quoting(
        failure, task.id, f"{status}: {untouched.error or untouched.evidence}", untouched, f"verifier {task.verifier}"
    )


#: Every probe's results per bundle (runtime key): `check_environment(reuse=True)` of the same content.
_RESULTS: SharedMemo[list[ProbeResult]] = SharedMemo(256)


def check_environment(runtime: Runtime, bundle: Bundle, *, reuse: bool = False) -> list[ProbeResult]:
    """All execution probes of `bundle` (the deep tool probes skip a tool whose one call crashed:
    reported once). With `reuse`, results for the same content (bundle key) computed earlier in this
    process, or being computed now, are returned instead of running again, and the deep probes reuse
    the outcomes of calls made for the same tool behaviour (tool_calls.tool_behaviour_key): the probes
    are deterministic, and generation runs them in the verifiers stage (each of its attempts) and
    again in validate."""
    if reuse:
        return _RESULTS.get(bundle.runtime_key, lambda: _probed(runtime, bundle, reuse=True))
    results = _probed(runtime, bundle, reuse=False)
    _RESULTS.put(bundle.runtime_key, results)
    return list(results)


def _probed(runtime: Runtime, bundle: Bundle, *, reuse: bool) -> list[ProbeResult]:
    """Every family of probes, in three chains run at once on the pool (quality/concurrently.py): the tools'
    (deep, then boundary and behaviour at once: they skip what crashed before them), the determinism
    replays, and the tasks' (reference solutions, then the invariants and the verifier mutations on their
    end states)."""
    results = probe_tools(runtime, bundle)
    if any(r.probe == Probe.TOOLS_LOAD for r in results):
        return results
    # the families below build on this module
    from worldsmith.quality.tool_replays import replay_tools

    crashed = frozenset(r.target for r in results if r.probe == Probe.TOOL_RUNS and not r.passed)
    tools, replays, tasks = together(
        [
            lambda: _tool_families(runtime, bundle, crashed, reuse=reuse),
            lambda: [replay_tools(runtime, bundle, skip=crashed)],
            lambda: _task_families(runtime, bundle),
        ]
    )
    deep, boundary, behaviour = tools
    (replayed,) = replays
    return results + deep + boundary + replayed + behaviour + [r for family in tasks for r in family]


def _tool_families(
    runtime: Runtime, bundle: Bundle, crashed: frozenset[str], *, reuse: bool
) -> list[list[ProbeResult]]:
    """The deep probes, then the boundary inputs and the behaviour probes (at once) of every tool that ran."""
    from worldsmith.quality.behaviour_probes import behaviour_probes
    from worldsmith.quality.deep_probes import deep_probes
    from worldsmith.quality.input_probes import boundary_probes

    deep = deep_probes(runtime, bundle, skip=crashed, reuse=reuse)
    crashing = crashed | {r.target for r in deep if r.probe == Probe.VALID_INPUTS and not r.passed}
    boundary, behaviour = together(
        [
            lambda: boundary_probes(runtime, bundle, skip=crashing),
            lambda: behaviour_probes(runtime, bundle, skip=crashing),
        ]
    )
    return [deep, boundary, behaviour]


def _task_families(runtime: Runtime, bundle: Bundle) -> list[list[ProbeResult]]:
    """The task probes, the invariants and the verifier mutations."""
    from worldsmith.quality.invariants import invariant_probes
    from worldsmith.quality.verifier_mutations import verifier_mutations

    tasks, replays = task_probes(runtime, bundle)
    return [tasks, invariant_probes(runtime, bundle, replays), verifier_mutations(runtime, bundle, replays)]
