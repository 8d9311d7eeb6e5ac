"""Read, validate, build and write bundle directories (design.md section 3).

`load_bundle` trusts nothing: every file is checked and every defect is reported with its
file, line or statement. Nothing here executes generated Python; SQL runs on a hardened
private in-memory database.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import jsonschema
from pydantic import ValidationError

from worldsmith.bundle.codepolicy import check_app_source, check_source
from worldsmith.bundle.errors import BundleError, BundleIssue
from worldsmith.bundle.sqlscript import SqlFault, build_world
from worldsmith.bundle.toolspec import derive_tool_schemas, function_signatures
from worldsmith.models.bundle import Manifest, TaskSpec, ToolSchema

MANIFEST = "manifest.json"
SOURCE_FILES = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")
DERIVED_FILES = ("tools.json", "world.db")
ARTIFACT_FILES = SOURCE_FILES + DERIVED_FILES
#: An ASGI environment's tools are the routes of app.py; tools.json is recorded from them (a source).
ASGI_SOURCE_FILES = ("schema.sql", "seed.sql", "app.py", "tools.json", "tasks.jsonl", "verifiers.py")
ASGI_DERIVED_FILES = ("world.db",)


def kind_files(manifest: Manifest | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(source files, derived files) of a bundle of the manifest's tools kind."""
    if manifest is not None and manifest.tools_kind == "asgi":
        return ASGI_SOURCE_FILES, ASGI_DERIVED_FILES
    return SOURCE_FILES, DERIVED_FILES


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def artifact_digest(data: bytes) -> str:
    """The manifest's notation for an artifact's hash: `sha256:<hex>`."""
    return "sha256:" + sha256_hex(data)


@dataclass(frozen=True)
class Bundle:
    """One validated environment version: its manifest, its files and what was derived from them."""

    manifest: Manifest
    files: dict[str, bytes]
    tasks: tuple[TaskSpec, ...]
    tools: tuple[ToolSchema, ...]
    root: Path | None = field(default=None, compare=False)

    @property
    def env_id(self) -> str:
        return self.manifest.env_id

    @property
    def world(self) -> bytes:
        """The serialized seeded database (`world.db`)."""
        return self.files["world.db"]

    def text(self, name: str) -> str:
        return self.files[name].decode("utf-8")

    @cached_property
    def key(self) -> str:
        """Content key of this version: sha256 over its env_id and artifact hashes (stable across copies)."""
        return sha256_hex(json.dumps({"env_id": self.env_id, "artifacts": self.manifest.artifacts}, sort_keys=True).encode())

    @cached_property
    def runtime_key(self) -> str:
        """What sandbox workers load this version under: its content key, and for an ASGI
        environment also the fixed instant its clock reads answer (part of its behaviour)."""
        clock = (self.manifest.origin or {}).get("clock") if self.manifest.tools_kind == "asgi" else None
        return f"{self.key}@{clock}" if clock else self.key

    def task(self, task_id: str) -> TaskSpec:
        for task in self.tasks:
            if task.id == task_id:
                return task
        raise KeyError(f"{self.env_id} has no task {task_id!r} (tasks: {', '.join(t.id for t in self.tasks)})")

    @cached_property
    def validators(self) -> dict[str, jsonschema.protocols.Validator]:
        """A prepared JSON Schema validator of each tool's arguments."""
        return {t.name: jsonschema.Draft202012Validator(t.parameters) for t in self.tools}

    def argument_error(self, name: str, arguments: dict[str, Any]) -> str | None:
        """Why calling tool `name` with `arguments` is refused before it runs (an unknown tool, arguments
        that break its schema), or None: the agent-facing message of a `tool_error`."""
        validator = self.validators.get(name)
        if validator is None:
            return f"unknown tool {name!r}; available tools: {', '.join(t.name for t in self.tools)}"
        problem = jsonschema_error(validator, arguments)
        return f"invalid arguments for {name}: {problem}" if problem else None

    def tool(self, name: str) -> ToolSchema:
        for tool in self.tools:
            if tool.name == name:
                return tool
        raise KeyError(name)


def _read_files(root: Path) -> tuple[dict[str, bytes], Manifest | None, list[BundleIssue]]:
    """The manifest, then the files of its kind (sources must exist, derived ones may)."""
    if not root.is_dir():
        raise BundleError.single(str(root), "bundle directory not found")
    files: dict[str, bytes] = {}
    issues: list[BundleIssue] = []
    manifest = None
    if not (root / MANIFEST).is_file():
        issues.append(BundleIssue(MANIFEST, "missing file"))
    else:
        files[MANIFEST] = (root / MANIFEST).read_bytes()
        text = _decode(files, MANIFEST, issues)
        manifest = _parse_manifest(text, issues) if text is not None else None
    sources, derived = kind_files(manifest)
    for name in sources:
        path = root / name
        if not path.is_file():
            issues.append(BundleIssue(name, "missing file"))
        else:
            files[name] = path.read_bytes()
    for name in derived:
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    return files, manifest, issues


def _decode(files: dict[str, bytes], name: str, issues: list[BundleIssue]) -> str | None:
    if name not in files:
        return None
    try:
        return files[name].decode("utf-8")
    except UnicodeDecodeError as exc:
        issues.append(BundleIssue(name, f"not UTF-8 text ({exc.reason} at byte {exc.start})"))
        return None


def _parse_manifest(text: str, issues: list[BundleIssue]) -> Manifest | None:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        issues.append(BundleIssue(MANIFEST, f"invalid JSON: {exc.msg}", exc.lineno))
        return None
    try:
        return Manifest.model_validate(data)
    except ValidationError as exc:
        for err in exc.errors():
            loc = ".".join(str(p) for p in err["loc"]) or "(root)"
            issues.append(BundleIssue(MANIFEST, f"field {loc}: {err['msg']}"))
        return None


def _check_hashes(manifest: Manifest, files: dict[str, bytes], issues: list[BundleIssue]) -> None:
    sources, derived = kind_files(manifest)
    artifact_files = sources + derived
    for name, digest in sorted(manifest.artifacts.items()):
        if name not in artifact_files:
            issues.append(BundleIssue(MANIFEST, f"lists unknown artifact {name!r}"))
        elif name not in files:
            issues.append(BundleIssue(name, "missing file (listed in manifest.json)"))
        elif artifact_digest(files[name]) != digest:
            issues.append(BundleIssue(name, f"sha256 mismatch: manifest.json says {digest}, file is {artifact_digest(files[name])}"))
    for name in artifact_files:
        if name in files and name not in manifest.artifacts:
            issues.append(BundleIssue(name, "not listed in manifest.json artifacts"))


def parse_tasks(text: str, issues: list[BundleIssue]) -> list[tuple[int, TaskSpec]]:
    """Parse `tasks.jsonl` into `(line, task)` pairs, recording each malformed line."""
    tasks: list[tuple[int, TaskSpec]] = []
    seen: set[str] = set()
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            task = TaskSpec.model_validate_json(raw)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'line'}: {e['msg']}" for e in exc.errors())
            issues.append(BundleIssue("tasks.jsonl", f"invalid task: {problems}", line))
            continue
        if task.id in seen:
            issues.append(BundleIssue("tasks.jsonl", f"duplicate task id {task.id!r}", line))
        seen.add(task.id)
        tasks.append((line, task))
    if not tasks and not issues:
        issues.append(BundleIssue("tasks.jsonl", "no tasks"))
    return tasks


#: Parameters a verifier takes, by verifiers kind: (accepted counts, how to say it).
VERIFIER_ARITY = {None: ((3,), "(initial, final, answer)"), "awm-code": ((2, 3), "(initial_db_path, final_db_path, final_answer=None)"),
                  "awm-sql": ((2,), "(initial_db_path, final_db_path)")}


def _check_tasks(tasks: list[tuple[int, TaskSpec]], tools: list[dict[str, Any]], verifiers_src: str, manifest: Manifest | None,
                 issues: list[BundleIssue]) -> None:
    try:
        verifiers = function_signatures(verifiers_src)
    except SyntaxError:
        verifiers = {}  # already reported by the code policy check
    by_name = {t["name"]: t for t in tools}
    arities, form = VERIFIER_ARITY[manifest.verifiers_kind if manifest else None]
    imported = manifest is not None and manifest.origin is not None
    for line, task in tasks:
        if task.verifier not in verifiers:
            issues.append(BundleIssue("tasks.jsonl", f"task {task.id!r}: verifier {task.verifier!r} is missing from verifiers.py", line))
        elif verifiers[task.verifier][1] not in arities:
            vline = verifiers[task.verifier][0]
            issues.append(BundleIssue("verifiers.py", f"verifier {task.verifier!r} must take {form}", vline))
        if not task.solution and not imported:  # imported environments may come without reference solutions
            issues.append(BundleIssue("tasks.jsonl", f"task {task.id!r}: reference solution is missing (empty)", line))
        for number, step in enumerate(task.solution, start=1):
            tool = by_name.get(step.tool)
            if tool is None:
                issues.append(BundleIssue("tasks.jsonl", f"task {task.id!r}: solution step {number} calls unknown tool {step.tool!r}", line))
                continue
            error = jsonschema_error(tool["parameters"], step.arguments)
            if error:
                issues.append(BundleIssue("tasks.jsonl", f"task {task.id!r}: solution step {number} ({step.tool}): {error}", line))


def jsonschema_error(schema: dict[str, Any] | jsonschema.protocols.Validator, arguments: Any) -> str | None:
    """The first reason `arguments` do not match `schema` (or a prepared validator), or None."""
    validator = schema if hasattr(schema, "iter_errors") else jsonschema.Draft202012Validator(schema)
    if validator.is_valid(arguments):
        return None
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"argument {where}: {error.message}" if where else error.message


def _stats(world: bytes, tools: list[dict[str, Any]], tasks: list[TaskSpec], files: dict[str, bytes]) -> dict[str, Any]:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name")]
    rows = sum(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)
    conn.close()
    loc = sum(files[n].decode().count("\n") for n in ("tools.py", "app.py", "verifiers.py") if n in files)
    return {"tables": len(tables), "rows": rows, "tools": len(tools), "tasks": len(tasks), "lines_of_code": loc, "world_bytes": len(world)}


def _recorded_tools(text: str, issues: list[BundleIssue]) -> list[dict[str, Any]]:
    """tools.json of an ASGI environment (recorded from its app's routes): a list of tool schemas."""
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError("expected a JSON list of tools")
        return [ToolSchema.model_validate(t).model_dump(exclude_none=True) for t in data]
    except (ValueError, ValidationError) as exc:
        issues.append(BundleIssue("tools.json", f"not a list of tool schemas: {str(exc).splitlines()[0]}"))
        return []


def _validate(files: dict[str, bytes], issues: list[BundleIssue],
              manifest: Manifest | None = None) -> tuple[list[dict[str, Any]], list[TaskSpec], bytes | None]:
    """Validate the source artifacts; returns the tool schemas, tasks and world bytes."""
    sources, _ = kind_files(manifest)
    texts = {name: _decode(files, name, issues) for name in sources}
    for name in ("tools.py", "verifiers.py"):
        if texts.get(name) is not None:
            issues.extend(BundleIssue(name, problem, line) for line, problem in check_source(texts[name], name))
    if texts.get("app.py") is not None:
        issues.extend(BundleIssue("app.py", problem, line) for line, problem in check_app_source(texts["app.py"]))
    tools: list[dict[str, Any]] = []
    if texts.get("tools.py") is not None:
        tools, tool_issues = derive_tool_schemas(texts["tools.py"])
        issues.extend(tool_issues)
    elif texts.get("tools.json") is not None:
        tools = _recorded_tools(texts["tools.json"], issues)
    world = None
    if texts["schema.sql"] is not None and texts["seed.sql"] is not None:
        world, faults = build_world(texts["schema.sql"], texts["seed.sql"])
        issues.extend(sql_issues(faults))
    tasks: list[TaskSpec] = []
    if texts["tasks.jsonl"] is not None:
        parsed = parse_tasks(texts["tasks.jsonl"], issues)
        tasks = [t for _, t in parsed]
        if texts["verifiers.py"] is not None and (texts.get("tools.py") or texts.get("tools.json")) is not None:
            _check_tasks(parsed, tools, texts["verifiers.py"], manifest, issues)
    return tools, tasks, world


def sql_issues(faults: list[SqlFault]) -> list[BundleIssue]:
    """SQL faults as bundle issues: file, line, problem and the statement's start."""
    return [BundleIssue(f.file, f.problem, f.line, f.statement.excerpt() if f.statement and f.statement.sql else None) for f in faults]


def tools_json_bytes(tools: list[dict[str, Any]]) -> bytes:
    return (json.dumps(tools, indent=2, sort_keys=False) + "\n").encode()


def load_bundle(path: str | Path) -> Bundle:
    """Read and fully validate the bundle directory at `path`; raise `BundleError` listing every defect."""
    root = Path(path)
    files, manifest, issues = _read_files(root)
    if manifest is not None:
        _check_hashes(manifest, files, issues)
    tools, tasks, world = _validate(files, issues, manifest)
    sources, derived = kind_files(manifest)
    if "tools.json" in derived and "tools.json" in files and tools and files["tools.json"] != tools_json_bytes(tools):
        issues.append(BundleIssue("tools.json", "does not match the signatures and docstrings of tools.py (rebuild with `worldsmith env build`)"))
    if "world.db" in files and world is not None and files["world.db"] != world:
        issues.append(BundleIssue("world.db", "does not match schema.sql + seed.sql (rebuild with `worldsmith env build`)"))
    if issues:
        raise BundleError(issues)
    assert manifest is not None and world is not None
    if "tools.json" in derived:
        files["tools.json"] = tools_json_bytes(tools)
    files["world.db"] = world
    return Bundle(
        manifest=manifest,
        files={name: files[name] for name in sources + derived},
        tasks=tuple(tasks),
        tools=tuple(ToolSchema.model_validate(t) for t in tools),
        root=root,
    )


def build_bundle(sources: dict[str, bytes | str], manifest: Manifest | dict[str, Any]) -> Bundle:
    """Make a bundle from its five source files: derive tools.json and world.db, hash every
    artifact into the manifest, compute stats. Raises `BundleError` on any defect."""
    files = {name: (data.encode() if isinstance(data, str) else data) for name, data in sources.items()}
    base = manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)
    source_files, derived = kind_files(base)
    issues = [BundleIssue(name, "missing file") for name in source_files if name not in files]
    tools, tasks, world = _validate(files, issues, base)
    if issues:
        raise BundleError(issues)
    assert world is not None
    if "tools.json" in derived:
        files["tools.json"] = tools_json_bytes(tools)
    files["world.db"] = world
    files = {name: files[name] for name in source_files + derived}
    final = base.model_copy(update={
        "artifacts": {name: artifact_digest(data) for name, data in files.items()},
        "stats": _stats(world, tools, tasks, files),
    })
    return Bundle(manifest=final, files=files, tasks=tuple(tasks), tools=tuple(ToolSchema.model_validate(t) for t in tools))


def manifest_bytes(manifest: Manifest) -> bytes:
    return (manifest.model_dump_json(indent=2, exclude_none=True) + "\n").encode()


def write_bundle(bundle: Bundle, path: str | Path) -> Path:
    """Write every file of `bundle` (manifest last) into directory `path`."""
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    for name, data in bundle.files.items():
        (root / name).write_bytes(data)
    (root / MANIFEST).write_bytes(manifest_bytes(bundle.manifest))
    return root


def rebuild_bundle_dir(path: str | Path) -> Bundle:
    """Re-derive tools.json, world.db and the manifest's hashes and stats of a bundle directory
    from its sources, keeping the manifest's identity fields. Used when authoring bundles."""
    root = Path(path)
    files, manifest, issues = _read_files(root)
    if issues or manifest is None:
        raise BundleError(issues)
    bundle = build_bundle({n: files[n] for n in kind_files(manifest)[0]}, manifest)
    write_bundle(bundle, root)
    return bundle
