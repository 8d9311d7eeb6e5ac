"""Read, validate, build and write bundle directories (the contract: worldsmith/bundle/contract.py).

`load_bundle` trusts nothing: every file is checked and every defect is reported with its
file, line or statement. Nothing here executes generated Python; SQL runs on a hardened
private in-memory database.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path

from pydantic import ValidationError

from worldsmith.bundle.codepolicy import check_source
from worldsmith.bundle.contract import (
    MANIFEST,
    Bundle,
    artifact_digest,
    jsonschema_error,
    tools_kind_of,
    verifiers_kind_of,
)
from worldsmith.bundle.errors import BundleError, BundleIssue
from worldsmith.bundle.invariants import INVARIANTS_FILE, parse_invariants
from worldsmith.bundle.schemadiff import tool_schema_differences
from worldsmith.bundle.sqlscript import SqlFault, build_world
from worldsmith.bundle.toolspec import derive_tool_schemas, function_signatures
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import Manifest, TaskSpec, ToolSchema


def _read_files(root: Path) -> tuple[dict[str, bytes], Manifest | None, list[BundleIssue]]:
    """The manifest, then the files of its kind (sources must exist, derived ones may)."""
    if not root.is_dir():
        what = "is a file, not a bundle directory" if root.exists() else "bundle directory not found"
        raise BundleError.single(str(root), f"{what}; give a bundle directory (manifest.json, schema.sql, ...)")
    files: dict[str, bytes] = {}
    issues: list[BundleIssue] = []
    manifest = None
    if not (root / MANIFEST).is_file():
        issues.append(BundleIssue(MANIFEST, "missing file"))
    else:
        files[MANIFEST] = (root / MANIFEST).read_bytes()
        text = _decode(files, MANIFEST, issues)
        manifest = _parse_manifest(text, issues) if text is not None else None
    kind = tools_kind_of(manifest)
    for name in kind.source_files:
        path = root / name
        if not path.is_file():
            issues.append(BundleIssue(name, "missing file"))
        else:
            files[name] = path.read_bytes()
    for name in kind.optional_files + kind.derived_files:
        if (root / name).is_file():
            files[name] = (root / name).read_bytes()
    if not files:  # not a broken bundle: no bundle at all
        expected = ", ".join([MANIFEST, *kind.source_files])
        raise BundleError.single(str(root), f"no bundle here (none of {expected}); give a bundle directory")
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
    artifact_files = tools_kind_of(manifest).artifact_files
    for name, digest in sorted(manifest.artifacts.items()):
        if name not in artifact_files:
            issues.append(BundleIssue(MANIFEST, f"lists unknown artifact {name!r}"))
        elif name not in files:
            issues.append(BundleIssue(name, "missing file (listed in manifest.json)"))
        elif artifact_digest(files[name]) != digest:
            issues.append(
                BundleIssue(
                    name, f"sha256 mismatch: manifest.json says {digest}, file is {artifact_digest(files[name])}"
                )
            )
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


def _check_tasks(
    tasks: list[tuple[int, TaskSpec]],
    tools: list[JsonObject],
    verifiers_src: str,
    manifest: Manifest | None,
    issues: list[BundleIssue],
) -> None:
    try:
        verifiers = function_signatures(verifiers_src)
    except SyntaxError:
        verifiers = {}  # already reported by the code policy check
    by_name = {t["name"]: t for t in tools}
    verifiers_kind = verifiers_kind_of(manifest)
    imported = manifest is not None and manifest.origin is not None
    for line, task in tasks:
        if task.verifier not in verifiers:
            issues.append(
                BundleIssue(
                    "tasks.jsonl", f"task {task.id!r}: verifier {task.verifier!r} is missing from verifiers.py", line
                )
            )
        elif verifiers[task.verifier][1] not in verifiers_kind.arities:
            vline = verifiers[task.verifier][0]
            problem = f"verifier {task.verifier!r} must take {verifiers_kind.signature}"
            issues.append(BundleIssue("verifiers.py", problem, vline))
        if not task.solution and not imported:  # imported environments may come without reference solutions
            issues.append(BundleIssue("tasks.jsonl", f"task {task.id!r}: reference solution is missing (empty)", line))
        for number, step in enumerate(task.solution, start=1):
            tool = by_name.get(step.tool)
            if tool is None:
                issues.append(
                    BundleIssue(
                        "tasks.jsonl",
                        f"task {task.id!r}: solution step {number} calls unknown tool {step.tool!r}",
                        line,
                    )
                )
                continue
            parameters = tool["parameters"]  # a dict: derived, or checked as a ToolSchema (_recorded_tools)
            error = jsonschema_error(parameters, step.arguments) if isinstance(parameters, dict) else None
            if error:
                issues.append(
                    BundleIssue("tasks.jsonl", f"task {task.id!r}: solution step {number} ({step.tool}): {error}", line)
                )


def _stats(world: bytes, tools: list[JsonObject], tasks: list[TaskSpec], files: dict[str, bytes]) -> dict[str, int]:
    conn = sqlite3.connect(":memory:")
    conn.deserialize(world)
    tables = [
        r[0]
        for r in conn.execute(
            "SELECT name FROM sqlite_master WHERE type='table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]
    rows = sum(conn.execute(f'SELECT COUNT(*) FROM "{t}"').fetchone()[0] for t in tables)
    conn.close()
    loc = sum(files[n].decode().count("\n") for n in ("tools.py", "app.py", "verifiers.py") if n in files)
    return {
        "tables": len(tables),
        "rows": rows,
        "tools": len(tools),
        "tasks": len(tasks),
        "lines_of_code": loc,
        "world_bytes": len(world),
    }


def _recorded_tools(text: str, issues: list[BundleIssue]) -> list[JsonObject]:
    """tools.json of an ASGI environment (recorded from its app's routes): a list of tool schemas."""
    try:
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError("expected a JSON list of tools")
        return [ToolSchema.model_validate(t).model_dump(exclude_none=True) for t in data]
    except (ValueError, ValidationError) as exc:
        issues.append(BundleIssue("tools.json", f"not a list of tool schemas: {str(exc).splitlines()[0]}"))
        return []


def _validate(
    files: dict[str, bytes], issues: list[BundleIssue], manifest: Manifest | None = None
) -> tuple[list[JsonObject], list[TaskSpec], bytes | None]:
    """Validate the source artifacts; returns the tool schemas, tasks and world bytes."""
    kind = tools_kind_of(manifest)
    texts = {name: _decode(files, name, issues) for name in kind.source_files}
    code = texts[kind.code_file]
    if code is not None:
        issues.extend(BundleIssue(kind.code_file, problem, line) for line, problem in kind.check_code(code))
    if texts["verifiers.py"] is not None:
        problems = check_source(texts["verifiers.py"], "verifiers.py")
        issues.extend(BundleIssue("verifiers.py", problem, line) for line, problem in problems)
    tools: list[JsonObject] = []
    if kind.derives_schemas:
        if code is not None:
            tools, tool_issues = derive_tool_schemas(code)
            issues.extend(tool_issues)
    elif texts["tools.json"] is not None:
        tools = _recorded_tools(texts["tools.json"], issues)
    world = None
    if texts["schema.sql"] is not None and texts["seed.sql"] is not None:
        world, faults = build_world(texts["schema.sql"], texts["seed.sql"])
        issues.extend(sql_issues(faults))
    if INVARIANTS_FILE in files:
        invariants_text = _decode(files, INVARIANTS_FILE, issues)
        stated = parse_invariants(invariants_text)[1] if invariants_text is not None else []
        issues.extend(BundleIssue(INVARIANTS_FILE, problem) for problem in stated)
    tasks: list[TaskSpec] = []
    if texts["tasks.jsonl"] is not None:
        parsed = parse_tasks(texts["tasks.jsonl"], issues)
        tasks = [t for _, t in parsed]
        if texts["verifiers.py"] is not None and (texts.get("tools.py") or texts.get("tools.json")) is not None:
            _check_tasks(parsed, tools, texts["verifiers.py"], manifest, issues)
    return tools, tasks, world


def sql_issues(faults: list[SqlFault]) -> list[BundleIssue]:
    """SQL faults as bundle issues: file, line, problem and the statement's start."""
    return [
        BundleIssue(f.file, f.problem, f.line, f.statement.excerpt() if f.statement and f.statement.sql else None)
        for f in faults
    ]


def tools_json_bytes(tools: list[JsonObject]) -> bytes:
    return (json.dumps(tools, indent=2, sort_keys=False) + "\n").encode()


def _written_tools_issues(written: bytes, derived: list[JsonObject]) -> list[BundleIssue]:
    """tools.json as written against the schemas tools.py gives, by meaning (`schemadiff`): an issue
    per tool and place that differs."""
    try:
        data = json.loads(written)
    except ValueError as exc:
        return [BundleIssue("tools.json", f"not JSON: {exc}")]
    fix = "(rebuild with `worldsmith env build`)"
    return [
        BundleIssue("tools.json", f"does not match the signatures and docstrings of tools.py: {difference} {fix}")
        for difference in tool_schema_differences(data, derived)
    ]


def load_bundle(path: str | Path) -> Bundle:
    """Read and fully validate the bundle directory at `path`; raise `BundleError` listing every defect."""
    root = Path(path)
    files, manifest, issues = _read_files(root)
    if manifest is not None:
        _check_hashes(manifest, files, issues)
    tools, tasks, world = _validate(files, issues, manifest)
    kind = tools_kind_of(manifest)
    if kind.derives_schemas and "tools.json" in files and tools:
        issues.extend(_written_tools_issues(files["tools.json"], tools))
    if "world.db" in files and world is not None and files["world.db"] != world:
        issues.append(
            BundleIssue("world.db", "does not match schema.sql + seed.sql (rebuild with `worldsmith env build`)")
        )
    if issues:
        raise BundleError(issues)
    assert manifest is not None and world is not None
    if kind.derives_schemas and "tools.json" not in files:
        files["tools.json"] = tools_json_bytes(tools)
    files["world.db"] = world
    return Bundle(
        manifest=manifest,
        files={name: files[name] for name in kind.artifact_files if name in files},
        tasks=tuple(tasks),
        tools=tuple(ToolSchema.model_validate(t) for t in tools),
        root=root,
    )


def build_bundle(sources: Mapping[str, bytes | str], manifest: Manifest | JsonObject) -> Bundle:
    """Make a bundle from its source files (the optional `invariants.json` included where given): derive tools.json and world.db, hash every
    artifact into the manifest, compute stats. Raises `BundleError` on any defect."""
    files = {name: (data.encode() if isinstance(data, str) else data) for name, data in sources.items()}
    base = manifest if isinstance(manifest, Manifest) else Manifest.model_validate(manifest)
    kind = tools_kind_of(base)
    issues = [BundleIssue(name, "missing file") for name in kind.source_files if name not in files]
    tools, tasks, world = _validate(files, issues, base)
    if issues:
        raise BundleError(issues)
    assert world is not None
    if kind.derives_schemas:
        files["tools.json"] = tools_json_bytes(tools)
    files["world.db"] = world
    files = {name: files[name] for name in kind.artifact_files if name in files}
    final = base.model_copy(
        update={
            "artifacts": {name: artifact_digest(data) for name, data in files.items()},
            "stats": _stats(world, tools, tasks, files),
        }
    )
    return Bundle(
        manifest=final, files=files, tasks=tuple(tasks), tools=tuple(ToolSchema.model_validate(t) for t in tools)
    )


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
    kind = tools_kind_of(manifest)
    bundle = build_bundle({n: files[n] for n in kind.source_files + kind.optional_files if n in files}, manifest)
    write_bundle(bundle, root)
    return bundle
