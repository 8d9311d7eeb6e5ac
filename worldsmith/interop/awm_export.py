"""Export of worldsmith environments in the AgentWorldModel-1K release format, for tools built for that release.

Per environment: its schema and seed split by table (gen_db, gen_sample), its tasks (gen_tasks),
an API spec with one POST route per tool (gen_spec), one FastAPI file (gen_envs) that wraps the
tool module unchanged (a pydantic model per tool from its JSON schema, the tool called with a
connection from the app's engine, ToolError answered as HTTP 409, results converted to JSON as the
sandbox converts them), and per task a verifier in both modes that opens the two database files
read-only and calls the environment's own verifier.
`solutions.json` (not part of the release) carries the reference solutions, so an export imported
again can be checked like the original.
"""

from __future__ import annotations

import ast
import inspect
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from worldsmith.bundle.codepolicy import RUNTIME_MODULE, parse_source
from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.jsonvalues import json_default
from worldsmith.bundle.kinds import APP_TOOLS, NATIVE_VERIFIERS
from worldsmith.bundle.sqlscript import split_statements
from worldsmith.interop.awm import (
    FILES,
    SOLUTIONS_FILE,
    VERIFIER_FILES,
    VERIFIER_FUNCTIONS,
    ScenarioSolutions,
    scenario_key,
)
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema

if TYPE_CHECKING:
    from worldsmith.storage.catalog import Catalog
    from worldsmith.storage.objectstore import ObjectStore

_TABLE = re.compile(r'^\s*CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?["`\[]?(\w+)', re.IGNORECASE)
_INDEX = re.compile(r'\bON\s+["`\[]?(\w+)', re.IGNORECASE)
_INSERT = re.compile(r'^\s*INSERT\s+(?:OR\s+\w+\s+)?INTO\s+["`\[]?(\w+)', re.IGNORECASE)
_TYPES = {"string": "str", "integer": "int", "number": "float", "boolean": "bool", "array": "list", "object": "dict"}

APP_PRELUDE = '''"""{title}: worldsmith environment {env_id} exported as a FastAPI app (AgentWorldModel-1K format)."""
import base64
import datetime
import decimal
import json
import os
import sqlite3
from typing import Any, Literal, Optional

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, Field
from sqlalchemy import create_engine

engine = create_engine(os.environ.get("DATABASE_PATH") or "sqlite:///{env_id}.db", connect_args={{"check_same_thread": False}})
app = FastAPI(title={title!r}, description={description!r})


class ToolError(Exception):
    """A business-rule refusal of a tool: answered as HTTP 409."""


{json_default}


def _plain(value: Any) -> Any:
    """A tool's result as the JSON worldsmith's sandbox makes of it."""
    return json.loads(json.dumps(value, default=json_default))


def _run(tool: Any, arguments: dict) -> Any:
    """Call a tool with a connection of the app's engine: committed when it returns, rolled back when it refuses."""
    raw = engine.raw_connection()
    try:
        conn = raw.driver_connection
        conn.row_factory = sqlite3.Row
        try:
            result = tool(conn, **arguments)
        except ToolError as exc:
            raw.rollback()
            raise HTTPException(status_code=409, detail=str(exc) or type(exc).__name__)
        raw.commit()
        return _plain(result)
    finally:
        raw.close()


# ---- the environment's tools (tools.py) ----
'''

_CALL_ON_FILES = """
    import sqlite3
    from pathlib import Path

    def _open(path):
        conn = sqlite3.connect(Path(path).resolve().as_uri() + "?mode=ro", uri=True)
        conn.row_factory = sqlite3.Row
        return conn

    initial, final = _open(initial_db_path), _open(final_db_path)
    try:
        outcome = {verifier}(initial, final, {answer})
    finally:
        initial.close()
        final.close()
"""

#: Per mode: the release's verifier function around the environment's own verifier `{verifier}`.
WRAPPERS = {
    "code": '''

def verify_task_completion(initial_db_path, final_db_path, final_answer=None):
    """{task_id}: the environment's verifier on read-only copies of the two databases."""'''
    + _CALL_ON_FILES.replace("{answer}", 'final_answer or ""')
    + """    return {{"result": "complete" if outcome.get("status") == "complete" else "others", "evidence": outcome.get("evidence", {{}})}}
""",
    "sql": '''

def verify_task(initial_db_path, final_db_path):
    """{task_id}: the environment's verifier's evidence on read-only copies of the two databases."""'''
    + _CALL_ON_FILES.replace("{answer}", '""')
    + """    return {{"status": outcome.get("status"), "evidence": outcome.get("evidence", {{}}), "all_checks_passed": outcome.get("status") == "complete"}}
""",
}
#: Per mode and verifiers kind: the release's verifier function around an imported environment's
#: verifier (already on files).
IMPORTED_WRAPPERS: dict[tuple[str, str | None], str] = {
    ("code", "awm-code"): "\n\ndef verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
    "    return {verifier}(initial_db_path, final_db_path, final_answer)\n",
    ("code", "awm-sql"): "\n\ndef verify_task_completion(initial_db_path, final_db_path, final_answer=None):\n"
    "    outcome = {verifier}(initial_db_path, final_db_path)\n"
    "    return {{'result': 'complete' if outcome.get('all_checks_passed') is True else 'others', 'evidence': outcome}}\n",
    ("sql", "awm-code"): "\n\ndef verify_task(initial_db_path, final_db_path):\n"
    "    outcome = {verifier}(initial_db_path, final_db_path)\n"
    "    return {{'evidence': outcome, 'all_checks_passed': outcome.get('result') == 'complete'}}\n",
    (
        "sql",
        "awm-sql",
    ): "\n\ndef verify_task(initial_db_path, final_db_path):\n    return {verifier}(initial_db_path, final_db_path)\n",
}


def _without_runtime_import(source: str) -> str:
    """`source` without its `from worldsmith.runtime import ToolError` lines (the app defines ToolError)."""
    tree = parse_source(source, "tools.py")
    lines = source.splitlines()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == RUNTIME_MODULE:
            for number in range(node.lineno - 1, (node.end_lineno or node.lineno)):
                lines[number] = ""
    return "\n".join(lines)


def _annotation(schema: Mapping[str, JsonValue]) -> str:
    """The app's type of a parameter: a Literal of its enum (so FastAPI refuses other values with 422,
    before the table's CHECK constraint would answer 500), else the JSON type's."""
    enum = schema.get("enum") or []
    values = [v for v in enum if v is not None] if isinstance(enum, list) else []
    if values and all(isinstance(v, str | int) and not isinstance(v, bool) for v in values):
        return f"Literal[{', '.join(repr(v) for v in values)}]"
    kind = schema.get("type", "string")
    kinds = kind if isinstance(kind, list) else [kind]
    names = [_TYPES.get(k, "Any") if isinstance(k, str) else "Any" for k in kinds if k != "null"] or ["Any"]
    return names[0] if len(names) == 1 else "Any"


def _model(tool: ToolSchema) -> tuple[str, str]:
    """(class name, source) of the request body model of one tool."""
    name = "".join(part.capitalize() for part in tool.name.split("_")) + "Request"
    required = set(tool.required_arguments())
    lines = [f"class {name}(BaseModel):"]
    for field, schema in tool.argument_schemas().items():
        described = f", description={schema['description']!r}" if schema.get("description") else ""
        if field in required:
            lines.append(f"    {field}: {_annotation(schema)} = Field(...{described})")
        else:
            lines.append(f"    {field}: Optional[{_annotation(schema)}] = Field(None{described})")
    if len(lines) == 1:
        lines.append("    pass")
    return name, "\n".join(lines)


def app_source(bundle: Bundle) -> str:
    """A FastAPI app serving `bundle`'s tools, one POST route each (operation_id = tool name)."""
    scenario = bundle.manifest.scenario
    prelude = APP_PRELUDE.format(
        title=scenario.name,
        env_id=bundle.env_id,
        description=scenario.description,
        json_default=inspect.getsource(json_default).strip(),
    )
    parts = [prelude, _without_runtime_import(bundle.text("tools.py")).strip(), "\n\n# ---- one route per tool ----"]
    for tool in bundle.tools:
        model, source = _model(tool)
        parts.append(source)
        parts.append(
            f"@app.post({f'/tools/{tool.name}'!r}, operation_id={tool.name!r}, summary={tool.description.splitlines()[0][:120]!r}, "
            f"description={tool.description!r})\n"
            f"def route_{tool.name}(payload: {model}):\n"
            f"    return _run({tool.name}, payload.model_dump(exclude_unset=True))"
        )
    return "\n\n\n".join(parts) + "\n"


def _spec(bundle: Bundle) -> JsonObject:
    """The release's API spec of the tools: one POST endpoint each, its body parameters from the tool's schema."""
    endpoints: list[JsonValue] = []
    for tool in bundle.tools:
        required = set(tool.required_arguments())
        endpoints.append(
            {
                "path": f"/tools/{tool.name}",
                "method": "POST",
                "summary": tool.description.splitlines()[0][:120],
                "description": tool.description,
                "operation_id": tool.name,
                "tags": [bundle.env_id],
                "request_params": {
                    name: {
                        "type": schema.get("type", "string"),
                        "param_type": "body",
                        "required": name in required,
                        "description": schema.get("description", ""),
                    }
                    for name, schema in tool.argument_schemas().items()
                },
                "response": {"type": "object", "description": "the tool's result"},
            }
        )
    return {"api_groups": [{"group_name": "Tools", "endpoints": endpoints}]}


def _tables(bundle: Bundle) -> tuple[list[JsonValue], dict[str, list[JsonValue]]]:
    """(db_schema tables, each table's insert statements) from schema.sql and seed.sql."""
    ddl: dict[str, str] = {}
    indexes: dict[str, list[JsonValue]] = {}
    for statement in split_statements(bundle.text("schema.sql")):
        table = _TABLE.match(statement.sql)
        if table:
            ddl[table.group(1)] = statement.sql.strip().rstrip(";") + ";"
            indexes[table.group(1)] = []
        elif (index := _INDEX.search(statement.sql)) and index.group(1) in ddl:
            indexes[index.group(1)].append(statement.sql.strip().rstrip(";") + ";")
    samples: dict[str, list[JsonValue]] = {}
    for statement in split_statements(bundle.text("seed.sql")):
        match = _INSERT.match(statement.sql)
        samples.setdefault(match.group(1) if match else "unknown", []).append(statement.sql.strip().rstrip(";") + ";")
    return [{"name": name, "ddl": ddl[name], "indexes": indexes[name]} for name in ddl], samples


def _verifier_code(bundle: Bundle, task_index: int, mode: str) -> str:
    """The task's verifier as the release's function of `mode`: the environment's verifiers with a wrapper."""
    task = bundle.tasks[task_index]
    if bundle.verifiers_kind is not NATIVE_VERIFIERS:  # imported: its verifiers already take database paths
        wrapper = IMPORTED_WRAPPERS[(mode, bundle.verifiers_kind.name)]
        return bundle.text("verifiers.py").strip() + "\n" + wrapper.format(verifier=task.verifier)
    return (
        _without_runtime_import(bundle.text("verifiers.py")).strip()
        + "\n"
        + WRAPPERS[mode].format(task_id=task.id, verifier=task.verifier)
    )


def export_bundles(bundles: list[Bundle], directory: Path) -> Path:
    """Write `bundles` as one release directory (every file of the format plus solutions.json)."""
    directory.mkdir(parents=True, exist_ok=True)
    out: dict[str, list[JsonObject]] = {name: [] for name in FILES}
    solutions: list[ScenarioSolutions] = []
    for bundle in bundles:
        scenario = bundle.manifest.scenario
        name = (
            scenario.name if scenario_key(scenario.name) == bundle.env_id else bundle.env_id
        )  # the key must give back the env_id
        key = scenario_key(name)
        db_path = f"./outputs/databases/{key}.db"
        tables, samples = _tables(bundle)
        out["gen_scenario.jsonl"].append({"name": name, "description": scenario.description})
        out["gen_tasks.jsonl"].append({"scenario": key, "tasks": [t.instruction for t in bundle.tasks]})
        out["gen_db.jsonl"].append({"scenario": key, "db_schema": {"tables": tables}, "db_path": db_path})
        out["gen_sample.jsonl"].append(
            {
                "scenario": key,
                "tables_count": len(tables),
                "inserts_count": sum(len(rows) for rows in samples.values()),
                "sample_data": {
                    "tables": [{"table_name": name, "insert_statements": rows} for name, rows in samples.items()]
                },
            }
        )
        imported = bundle.tools_kind is APP_TOOLS  # its app.py is already the release's FastAPI file
        out["gen_spec.jsonl"].append({"scenario": key, "api_spec": {} if imported else _spec(bundle)})
        app = bundle.text(APP_TOOLS.code_file) if imported else app_source(bundle)
        out["gen_envs.jsonl"].append({"scenario": key, "db_path": db_path, "full_code": app})
        for index, task in enumerate(bundle.tasks):
            for mode, file in VERIFIER_FILES.items():
                code = _verifier_code(bundle, index, mode)
                out[file].append(
                    {
                        "scenario": key,
                        "task_idx": index,
                        "task": task.instruction,
                        "verification": {
                            "code": code,
                            "raw_response": json.dumps({"function_name": VERIFIER_FUNCTIONS[mode]}),
                        },
                    }
                )
        solutions.append(
            {
                "scenario": key,
                "solutions": [
                    {
                        "task_idx": i,
                        "task": t.instruction,
                        "calls": [{"operation_id": s.tool, "arguments": s.arguments} for s in t.solution],
                        "final_answer": t.answer,
                    }
                    for i, t in enumerate(bundle.tasks)
                ],
            }
        )
    for name, rows in out.items():
        (directory / name).write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    (directory / SOLUTIONS_FILE).write_text(json.dumps(solutions, indent=1) + "\n", encoding="utf-8")
    return directory


def export_set(set_name: str, directory: Path, store: ObjectStore, catalog: Catalog) -> list[str]:
    """Write the members of environment set `set_name` (fetched from the store) as a release
    directory; returns their refs."""
    import tempfile

    from worldsmith.storage.publish import fetch
    from worldsmith.storage.sets import get_set, members_of

    with catalog.session() as session:
        refs = [version.ref for version, _ in members_of(session, get_set(session, set_name))]
    with tempfile.TemporaryDirectory() as scratch:
        bundles = [fetch(ref, Path(scratch) / ref.replace("@", "_"), store, catalog) for ref in refs]
        export_bundles(bundles, directory)
    return refs
