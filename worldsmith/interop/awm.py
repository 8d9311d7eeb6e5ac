"""Import of the AgentWorldModel-1K release format (its files: tests/data/awm_format_sample/README.md)
as worldsmith bundles.

One scenario (its records across the release's JSON-lines files) becomes one bundle of the ASGI
kind: schema.sql and seed.sql from the table DDL and the insert statements, app.py the release's
FastAPI file unchanged (the sandbox rewrites its engine creation when it loads it), tools.json
read from the app's routes in a sandbox worker, tasks.jsonl from the task sentences (ids t00..t09;
reference solutions from a `solutions.json` beside the files when there is one), and verifiers.py
the task verifiers of the chosen mode, each renamed `verify_tNN`.

Seed inserts run one by one as in the release; an insert that fails is dropped from seed.sql and
recorded, and the environment is then published as failed: never silently accepted.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import sqlite3
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypedDict, TypeVar

from worldsmith.bundle import sqlscript
from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.errors import BundleError
from worldsmith.bundle.kinds import APP_TOOLS, RELEASE_CODE_VERIFIERS, RELEASE_SQL_VERIFIERS, VerifiersKind
from worldsmith.bundle.loader import build_bundle, tools_json_bytes
from worldsmith.bundle.sqlscript import SqlBudget, Statement, bounded_connection, snapshot, split_statements
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ENV_ID_PATTERN
from worldsmith.runtime.episode import Runtime
from worldsmith.runtime.errors import RuntimeFault

VerifierMode = Literal["sql", "code"]
#: The release's files: name -> whether one scenario has one record (else one per task).
FILES = {
    "gen_scenario.jsonl": True,
    "gen_tasks.jsonl": True,
    "gen_db.jsonl": True,
    "gen_sample.jsonl": True,
    "gen_spec.jsonl": True,
    "gen_envs.jsonl": True,
    "gen_verifier.jsonl": False,
    "gen_verifier.pure_code.jsonl": False,
}
VERIFIER_FILES = {"sql": "gen_verifier.jsonl", "code": "gen_verifier.pure_code.jsonl"}
VERIFIER_FUNCTIONS = {"sql": "verify_task", "code": "verify_task_completion"}
#: The verifiers kind of each mode.
VERIFIERS_KIND_BY_MODE: dict[str, VerifiersKind] = {"sql": RELEASE_SQL_VERIFIERS, "code": RELEASE_CODE_VERIFIERS}
SOLUTIONS_FILE = "solutions.json"

_T = TypeVar("_T")
#: A record of a release file with where it is (`FILE:LINE`).
_Located = tuple[str, JsonObject]


class ReferenceCall(TypedDict, total=False):
    """One tool call of a reference solution in solutions.json."""

    operation_id: str  # the tool
    arguments: JsonObject | None


class ReferenceSolution(TypedDict, total=False):
    """One task's reference solution in solutions.json."""

    task_idx: int
    task: str  # its sentence
    calls: list[ReferenceCall]
    final_answer: str | None


class ScenarioSolutions(TypedDict):
    """One record of solutions.json (not part of the release): a scenario's reference solutions."""

    scenario: str
    solutions: list[ReferenceSolution]


class AwmFormatError(WorldsmithError, ValueError):
    """A release directory that cannot be read: the message names the file, the line and the problem."""


def scenario_key(name: str) -> str:
    """The release's normalised scenario name: lower case, anything outside [a-z0-9_] becomes `_`, runs collapsed."""
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9_]", "_", name.lower()))


def env_id_for(key: str) -> str:
    """A worldsmith env_id for a scenario key (snake case, starts with a letter, at most 64 characters)."""
    candidate = key.strip("_") or "scenario"
    if not candidate[0].isalpha():
        candidate = "awm_" + candidate
    if len(candidate) > 64:
        candidate = candidate[:55].rstrip("_") + "_" + hashlib.sha256(key.encode()).hexdigest()[:8]
    if not ENV_ID_PATTERN.match(candidate):
        raise AwmFormatError(f"scenario {key!r} gives no valid env_id")
    return candidate


@dataclass
class AwmScenario:
    """Everything the release holds about one scenario."""

    key: str
    name: str
    description: str
    tasks: list[str]
    tables: list[JsonObject]  # db_schema.tables: name, ddl, indexes
    inserts: list[str]
    app: str
    verifiers: dict[str, dict[int, str]]  # mode -> task index -> code
    spec: JsonObject = field(default_factory=dict)
    solutions: dict[int, ReferenceSolution] = field(default_factory=dict)


def _records(path: Path) -> list[tuple[int, JsonObject]]:
    rows: list[tuple[int, JsonObject]] = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise AwmFormatError(f"{path.name}:{number}: invalid JSON ({exc.msg})") from None
        if not isinstance(record, dict):
            raise AwmFormatError(f"{path.name}:{number}: expected a JSON object")
        rows.append((number, record))
    return rows


def _field(record: Mapping[str, JsonValue], name: str, kind: type[_T], where: str) -> _T:
    value = record.get(name)
    if not isinstance(value, kind):
        raise AwmFormatError(f"{where}: field {name!r} is missing or not a {kind.__name__}")
    return value


def read_release(directory: Path, scenarios: list[str] | None = None) -> list[AwmScenario]:
    """The scenarios of a release directory (all, or those named), validated field by field."""
    if not directory.is_dir():
        raise AwmFormatError(f"{directory} is not a directory; give the directory of an AgentWorldModel-1K download")
    missing = [name for name in FILES if not (directory / name).is_file()]
    if missing:
        raise AwmFormatError(f"{directory} lacks {', '.join(missing)} (see the AgentWorldModel-1K file layout)")
    by_file: dict[str, dict[str, _Located]] = {name: {} for name, single in FILES.items() if single}
    by_task: dict[str, dict[str, dict[int, _Located]]] = {name: {} for name, single in FILES.items() if not single}
    for name, single in FILES.items():
        for number, record in _records(directory / name):
            where = f"{name}:{number}"
            key = (
                scenario_key(_field(record, "name", str, where))
                if name == "gen_scenario.jsonl"
                else _field(record, "scenario", str, where)
            )
            if single:
                by_file[name][key] = (where, record)
            else:
                by_task[name].setdefault(key, {})[int(_field(record, "task_idx", int, where))] = (where, record)
    solutions = _solutions(directory / SOLUTIONS_FILE)
    keys = sorted(by_file["gen_scenario.jsonl"])
    if scenarios:
        unknown = sorted(set(scenarios) - set(keys))
        if unknown:
            raise AwmFormatError(
                f"no scenario {', '.join(unknown)} in {directory} (it has: {', '.join(keys) or 'none'})"
            )
        keys = [k for k in keys if k in scenarios]
    return [_scenario(key, by_file, by_task, solutions.get(key, {})) for key in keys]


def _scenario(
    key: str,
    by_file: dict[str, dict[str, _Located]],
    by_task: dict[str, dict[str, dict[int, _Located]]],
    solutions: dict[int, ReferenceSolution],
) -> AwmScenario:
    """Scenario `key` from the records of the one-per-scenario files (`by_file`) and the per-task ones (`by_task`)."""

    def one(name: str) -> _Located:
        if key not in by_file[name]:
            raise AwmFormatError(f"{name}: no record for scenario {key!r}")
        return by_file[name][key]

    where, scenario = one("gen_scenario.jsonl")
    where_t, tasks = one("gen_tasks.jsonl")
    where_d, db = one("gen_db.jsonl")
    where_s, sample = one("gen_sample.jsonl")
    where_e, env = one("gen_envs.jsonl")
    _, spec = one("gen_spec.jsonl")
    task_list = _field(tasks, "tasks", list, where_t)
    tables = _field(_field(db, "db_schema", dict, where_d), "tables", list, where_d)
    inserts = [
        stmt
        for table in _field(_field(sample, "sample_data", dict, where_s), "tables", list, where_s)
        for stmt in _field(table, "insert_statements", list, where_s)
    ]
    api_spec = spec.get("api_spec") or {}
    verifiers: dict[str, dict[int, str]] = {}
    for mode, name in VERIFIER_FILES.items():
        verifiers[mode] = {
            idx: _field(_field(record, "verification", dict, w), "code", str, w)
            for idx, (w, record) in by_task[name].get(key, {}).items()
        }
    return AwmScenario(
        key=key,
        name=_field(scenario, "name", str, where),
        description=str(scenario.get("description", "")),
        tasks=[str(t) for t in task_list],
        tables=tables,
        inserts=[str(s) for s in inserts],
        app=_field(env, "full_code", str, where_e),
        verifiers=verifiers,
        spec=api_spec if isinstance(api_spec, dict) else {},
        solutions=solutions,
    )


def _solutions(path: Path) -> dict[str, dict[int, ReferenceSolution]]:
    """Reference solutions by scenario and task index (not part of the release; optional)."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise AwmFormatError(f"{path.name}: invalid JSON ({exc.msg})") from None
    records = data if isinstance(data, list) else [data]
    return {scenario_key(r["scenario"]): {int(s["task_idx"]): s for s in r.get("solutions", [])} for r in records}


# -- the bundle's files ------------------------------------------------------------------------


def schema_sql(scenario: AwmScenario) -> str:
    """Every table's DDL, then its indexes, in the release's order."""
    lines = []
    for table in scenario.tables:
        lines.append(str(table.get("ddl", "")).strip())
        indexes = table.get("indexes", [])
        lines.extend(str(index).strip() for index in (indexes if isinstance(indexes, list) else []))
    return "\n".join(line if line.endswith(";") else line + ";" for line in lines if line) + "\n"


@dataclass
class SeedLoad:
    """The inserts that loaded (in order) and the ones that failed, with SQLite's message; or why
    loading stopped (a schema statement that fails, a statement past the SQL budget)."""

    loaded: list[str]
    failed: list[tuple[str, str]]
    schema_error: str | None = None
    world: bytes | None = None  # the database they made
    stopped: str | None = None  # an insert past the SQL budget, named (no world then)


def load_seed(schema: str, inserts: list[str], budget: SqlBudget | None = None) -> SeedLoad:
    """Run the schema, then each insert on its own with foreign keys on (as the release does), every
    statement within `budget` (None: the budget of every bundle build, `BUILD_BUDGET`): one that
    runs past it (an endless recursive CTE, a bloating one) stops the load, named."""
    with bounded_connection(budget or sqlscript.BUILD_BUDGET) as (conn, meter):
        for statement in split_statements(schema):
            try:
                with meter.statement():
                    conn.execute(statement.sql)
            except sqlite3.Error as exc:
                problem = f"stopped: the statement exceeded {meter.exceeded}" if meter.exceeded else f"fails: {exc}"
                return SeedLoad(
                    [], [], f"schema statement at line {statement.line} {problem} ({statement.excerpt(120)})"
                )
        result = SeedLoad([], [])
        for number, insert in enumerate(inserts, start=1):
            try:
                with meter.statement():
                    conn.execute(insert)
                result.loaded.append(insert.strip())
            except sqlite3.Error as exc:
                if meter.exceeded:
                    excerpt = Statement(insert.strip(), 1).excerpt(120)
                    result.stopped = f"insert {number} stopped: the statement exceeded {meter.exceeded} ({excerpt})"
                    return result
                result.failed.append((insert.strip(), str(exc)))
            if meter.spent:
                result.stopped = (
                    f"stopped after insert {number}: the load exceeded its time budget of {meter.budget.total_s:g} s"
                )
                return result
        result.world = snapshot(conn)
        return result


def _renamed(code: str, old: str, new: str, where: str) -> str:
    """`code` with its top-level function `old` renamed `new` (found in the syntax tree, edited at its line)."""
    try:
        tree = parse_source(code, where)
    except SyntaxError as exc:
        raise AwmFormatError(f"{where}: verifier code does not parse: {exc.msg} (line {exc.lineno})") from None
    node = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == old), None)
    if node is None:
        raise AwmFormatError(f"{where}: verifier code defines no function {old!r}")
    lines = code.splitlines()
    line = lines[node.lineno - 1]
    lines[node.lineno - 1] = line[: node.col_offset] + re.sub(
        rf"\bdef\s+{old}\b", f"def {new}", line[node.col_offset :], count=1
    )
    return "\n".join(lines)


def verifier_name(index: int) -> str:
    return f"verify_t{index:02d}"


def verifiers_py(scenario: AwmScenario, mode: VerifierMode) -> str:
    """The scenario's verifiers of `mode`, one function per task named `verify_tNN`."""
    codes = scenario.verifiers[mode]
    missing = [i for i in range(len(scenario.tasks)) if i not in codes]
    if missing:
        raise AwmFormatError(f"{VERIFIER_FILES[mode]}: scenario {scenario.key!r} has no verifier for task(s) {missing}")
    parts = [f'"""Verifiers of {scenario.name} ({mode} mode), imported from the AgentWorldModel-1K format."""\n']
    for index in range(len(scenario.tasks)):
        where = f"{VERIFIER_FILES[mode]} task {index}"
        parts.append(
            f"# task {index}\n"
            + _renamed(codes[index], VERIFIER_FUNCTIONS[mode], verifier_name(index), where).strip()
            + "\n"
        )
    return "\n\n".join(parts)


def tasks_jsonl(scenario: AwmScenario) -> str:
    """One task per sentence: id tNN, its verifier, the reference calls where solutions.json has them."""
    lines = []
    for index, sentence in enumerate(scenario.tasks):
        solution = scenario.solutions.get(index, {})
        steps = [{"tool": c["operation_id"], "arguments": c.get("arguments") or {}} for c in solution.get("calls", [])]
        lines.append(
            json.dumps(
                {
                    "id": f"t{index:02d}",
                    "instruction": sentence,
                    "verifier": verifier_name(index),
                    "solution": steps,
                    "answer": solution.get("final_answer"),
                }
            )
        )
    return "\n".join(lines) + "\n"


#: The parts of a scenario an import problem can name besides a bundle file (ImportProblem.part).
SCHEMA, SQL_BUDGET, SEED, VERIFIERS, APP = "schema", "sql budget", "seed", "verifiers", "app"


@dataclass(frozen=True)
class ImportProblem:
    """A defect found importing a scenario: the `part` at fault (`SCHEMA`, `SQL_BUDGET`, `SEED`,
    `VERIFIERS`, `APP`, or a bundle file by name) and what is wrong with it; for an app that does not load,
    the sandbox `limit` it broke, with the `refused_module` of a refused import."""

    part: str
    problem: str
    limit: str | None = None
    refused_module: str | None = None

    def __str__(self) -> str:
        return f"{self.part}: {self.problem}"


@dataclass
class Imported:
    """One imported scenario: its bundle (None when none could be made) and every defect found."""

    scenario: str
    env_id: str
    bundle: Bundle | None
    defects: list[ImportProblem] = field(default_factory=list)
    failed_inserts: list[tuple[str, str]] = field(default_factory=list)
    inserts: int = 0
    stand_in_reads: list[str] = field(default_factory=list)  # the routes its template read ahead (AppRoutes)


def import_scenario(
    scenario: AwmScenario, runtime: Runtime, mode: VerifierMode = "code", clock: str | None = None
) -> Imported:
    """Make the scenario's bundle: seed loaded insert by insert, tools read from the app's routes
    inside the sandbox. Defects (failed inserts, an app that does not load, bad verifiers) are
    listed in `defects`; a bundle is still made when only inserts failed. The app's clock is fixed
    at `clock` (ISO, UTC; default now, to the second), recorded in the manifest."""
    env_id = env_id_for(scenario.key)
    result = Imported(scenario.key, env_id, None, inserts=len(scenario.inserts))
    schema = schema_sql(scenario)
    seed = load_seed(schema, scenario.inserts)
    if seed.schema_error:
        result.defects.append(ImportProblem(SCHEMA, f"{seed.schema_error}"))
        return result
    if seed.stopped:
        result.defects.append(ImportProblem(SQL_BUDGET, f"{seed.stopped}"))
        return result
    result.failed_inserts = seed.failed
    if seed.failed:
        first, error = seed.failed[0]
        result.defects.append(
            ImportProblem(
                SEED, f"{len(seed.failed)} of {len(scenario.inserts)} inserts fail (first: {error}: {first[:120]})"
            )
        )
    if not seed.loaded:
        result.defects.append(ImportProblem(SEED, "no insert loads"))
        return result
    try:
        verifiers = verifiers_py(scenario, mode)
    except AwmFormatError as exc:
        result.defects.append(ImportProblem(VERIFIERS, f"{exc}"))
        return result
    sources: dict[str, str | bytes] = {
        "schema.sql": schema,
        "seed.sql": "\n".join(seed.loaded) + "\n",
        "app.py": scenario.app,
        "tasks.jsonl": tasks_jsonl(scenario),
        "verifiers.py": verifiers,
    }
    manifest: JsonObject = {
        "env_id": env_id,
        "scenario": {"name": scenario.name, "description": scenario.description, "categories": ["awm-import"]},
        "generator": {"backend": "awm-import"},
        "tools_kind": APP_TOOLS.name,
        "verifiers_kind": VERIFIERS_KIND_BY_MODE[mode].name,
        # the app's clock reads answer this instant: episodes replay to the same database
        "clock": clock or datetime.now(UTC).replace(microsecond=0, tzinfo=None).isoformat(),
        "origin": {
            "format": "agentworldmodel-1k",
            "scenario": scenario.key,
            "verifier_mode": mode,
            "failed_inserts": len(seed.failed),
            "inserts": len(scenario.inserts),
        },
    }
    assert seed.world is not None  # made: the schema ran and the load did not stop
    try:
        routes = runtime.describe_app(scenario.app, seed.world)
    except RuntimeFault as exc:  # no worker could run it
        result.defects.append(ImportProblem(APP, f"{exc}"))
        return result
    if routes.error is not None:
        result.defects.append(ImportProblem(APP, routes.error, routes.limit, routes.refused_module))
        return result
    result.stand_in_reads = routes.stand_in_reads
    try:
        result.bundle = build_bundle({**sources, "tools.json": tools_json_bytes(routes.tools)}, manifest)
    except BundleError as exc:
        result.defects.extend(
            ImportProblem(issue.file, issue.problem + (f" (line {issue.line})" if issue.line else ""))
            for issue in exc.issues[:10]
        )
    return result
