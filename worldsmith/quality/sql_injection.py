"""No SQL text built from arguments (`Probe.NO_SQL_FROM_ARGUMENTS`), found two ways.

- Statically (`sql_from_arguments`): in tools.py, a tool's text parameter (or a name assigned from it by
  plain text operations: `q = query.strip().lower()`) formatted into a string (an f-string, `%`, `+`,
  `.format`) that reaches `execute`/`executemany`/`executescript` directly, through a name assigned or
  extended (`+=`) with it, or through a helper of the module whose parameter reaches its own execute so:
  `ProbeFailure.SQL_BUILT_FROM_ARGUMENTS`, naming the tool and the line. Values passed through containers,
  other calls or subscripts are not followed (nothing is judged that is not certain).
- By injection (`injection_probes`): each text parameter of a tool is called with an ordinary value
  followed by `' OR 1=1 --`, and with the same text without the quote. Parameterized SQL treats both as
  text; SQL built from the argument crashes on the first (a syntax error) or selects, or changes, more rows
  with it than with the plain text: `ProbeFailure.SQL_INJECTION_ACCEPTED`.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.models.bundle import ToolSchema
from worldsmith.models.results import ToolResult
from worldsmith.quality.behaviour_calls import Caller, parameter_kinds, rows_of
from worldsmith.quality.probe_results import Probe, ProbeFailure, ProbeResult
from worldsmith.quality.probes import excerpt
from worldsmith.quality.tool_tables import is_read_tool

INJECTION = "' OR 1=1 --"
PLAIN = " OR 1=1 --"
_EXECUTE = frozenset({"execute", "executemany", "executescript"})
#: Methods of text that return text of it: a name assigned so still holds the argument.
_TEXT_METHODS = frozenset({"strip", "lower", "upper", "casefold", "title", "lstrip", "rstrip", "replace", "capitalize"})
_SQL_ERROR = re.compile(r"syntax error|unrecognized token|incomplete input|near \"|bindings|OperationalError", re.I)


@dataclass(frozen=True)
class BuiltSql:
    """A statement a tool builds from its argument: the tool, the parameter, the line."""

    tool: str
    parameter: str
    line: int


def _text_parameters(tool: ToolSchema) -> list[str]:
    """The parameters of `tool` that take free text (a string without an enum)."""
    found = []
    for name, schema in tool.argument_schemas().items():
        options = [o for key in ("anyOf", "oneOf") for o in _listed(schema.get(key)) if isinstance(o, dict)]
        kinds = parameter_kinds(schema) or {"string"}
        if "string" in kinds and "enum" not in schema and not any("enum" in o for o in options):
            found.append(name)
    return found


def _listed(value: JsonValue) -> list[JsonValue]:
    return value if isinstance(value, list) else []


def _holds(expr: ast.expr, tainted: set[str]) -> str | None:
    """The tainted name `expr` evaluates to text of (a name, its text methods, str() of it), else None."""
    if isinstance(expr, ast.Name):
        return expr.id if expr.id in tainted else None
    if isinstance(expr, ast.Call):
        func = expr.func
        if isinstance(func, ast.Attribute) and func.attr in _TEXT_METHODS:
            return _holds(func.value, tainted)
        if isinstance(func, ast.Name) and func.id == "str" and expr.args:
            return _holds(expr.args[0], tainted)
    return None


def _built(expr: ast.expr, tainted: set[str], sql: set[str]) -> str | None:
    """The tainted name `expr` formats into text (f-string, %, +, .format), or a name of built SQL."""
    if isinstance(expr, ast.Name) and expr.id in sql:
        return expr.id
    if isinstance(expr, ast.JoinedStr):
        for part in expr.values:
            if isinstance(part, ast.FormattedValue) and (name := _holds(part.value, tainted)):
                return name
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, (ast.Add, ast.Mod)):
        for side in (expr.left, expr.right):
            if name := _holds(side, tainted) or _built(side, tainted, sql):
                return name
            if isinstance(side, ast.Tuple):
                for element in side.elts:
                    if name := _holds(element, tainted):
                        return name
    if isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "format":
        for argument in [*expr.args, *(k.value for k in expr.keywords)]:
            if name := _holds(argument, tainted):
                return name
    return None


def _statements(function: ast.FunctionDef) -> list[ast.stmt | ast.expr]:
    """The statements and expressions of `function` in source order."""
    nodes = [n for n in ast.walk(function) if isinstance(n, (ast.stmt, ast.expr))]
    return sorted(nodes, key=lambda n: (n.lineno, n.col_offset))


def _reaches(function: ast.FunctionDef, tainted: set[str], helpers: dict[str, set[int]]) -> tuple[str, int] | None:
    """The first tainted name of `function` that reaches SQL built from it, and the line (None: none)."""
    tainted, sql = set(tainted), set[str]()
    origin: dict[str, str] = {name: name for name in tainted}
    for node in _statements(function):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and node.value is not None:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id for t in targets if isinstance(t, ast.Name)]
            if built := _built(node.value, tainted, sql):
                sql.update(names)
                origin.update({n: origin.get(built, built) for n in names})
            elif held := _holds(node.value, tainted):
                tainted.update(names)
                origin.update({n: origin.get(held, held) for n in names})
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _EXECUTE:
                if name := _built(node.args[0], tainted, sql):
                    return origin.get(name, name), node.lineno
            elif isinstance(func, ast.Name) and func.id in helpers:
                for position in helpers[func.id]:
                    if position < len(node.args) and (name := _holds(node.args[position], tainted)):
                        return origin.get(name, name), node.lineno
    return None


def sql_from_arguments(tools_py: str, tools: list[ToolSchema]) -> list[BuiltSql]:
    """The tools of `tools_py` that build SQL text from a text argument (see the module docstring)."""
    try:
        tree = parse_source(tools_py, "tools.py")
    except SyntaxError:
        return []
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    schemas = {t.name: t for t in tools}
    helpers: dict[str, set[int]] = {}
    for name, function in functions.items():
        if name in schemas:
            continue
        positions = {
            i for i, argument in enumerate(function.args.args) if _reaches(function, {argument.arg}, {}) is not None
        }
        if positions:
            helpers[name] = positions
    found = []
    for name, function in functions.items():
        if name not in schemas:
            continue
        reached = _reaches(function, set(_text_parameters(schemas[name])), helpers)
        if reached is not None:
            found.append(BuiltSql(name, *reached))
    return found


def static_probes(tools_py: str | None, tools: list[ToolSchema]) -> dict[str, ProbeResult]:
    """The static failure of each tool that builds SQL from an argument, by tool name."""
    if tools_py is None:
        return {}
    return {
        found.tool: ProbeResult.failing(
            ProbeFailure.SQL_BUILT_FROM_ARGUMENTS,
            found.tool,
            f"tools.py line {found.line} formats argument {found.parameter!r} into SQL text: pass it as a ? parameter",
            cause=f"tools.py:{found.line}",
        )
        for found in sql_from_arguments(tools_py, tools)
    }


def _count(caller: Caller, tool: str, arguments: JsonObject, reads: bool) -> tuple[ToolResult, int | None]:
    """A call's result, and how many rows it returned (a read) or changed (a write); None when not known."""
    if reads:
        result = caller.call(tool, arguments)
        rows = rows_of(result.value) if result.ok else None
        return result, (len(rows) if rows is not None else None)
    written = caller.write(tool, arguments)
    changed = sum(len(t.inserted) + len(t.updated) + len(t.deleted) for t in written.changes.tables.values())
    return written.result, changed


def injection_probes(
    caller: Caller,
    tools: list[ToolSchema],
    bases: dict[str, JsonObject],
    static: dict[str, ProbeResult],
    per_tool: int = 2,
) -> list[ProbeResult]:
    """`Probe.NO_SQL_FROM_ARGUMENTS` of every tool with a text parameter: its static failure, else what the
    injection calls show (`bases`: each tool's ordinary valid arguments) on `per_tool` text parameters of a
    read, one of a write (each written call costs a restore). The unquoted call is made only when the
    injected one selected more than one row, or changed more than two (a row and its log)."""
    results: list[ProbeResult] = []
    for tool in tools:
        texts = _text_parameters(tool)
        if tool.name in static:
            results.append(static[tool.name])
            continue
        if not texts or tool.name not in bases:
            continue
        base, reads = bases[tool.name], is_read_tool(tool.name)
        failure = None
        for parameter in texts[: per_tool if reads else 1]:
            ordinary = base.get(parameter)
            ordinary = ordinary if isinstance(ordinary, str) else "x"
            injected = {**base, parameter: ordinary + INJECTION}
            result, injected_n = _count(caller, tool.name, injected, reads)
            if result.status == "env_error" and _SQL_ERROR.search(result.error or ""):
                detail = f"called with {excerpt(injected)} it failed in SQL: {excerpt(result.error or '')}"
                failure = ProbeResult.failing(ProbeFailure.SQL_INJECTION_ACCEPTED, tool.name, detail, cause=parameter)
                break
            if not result.ok or injected_n is None or injected_n <= (1 if reads else 2):  # a row, and its log
                continue
            _, plain_n = _count(caller, tool.name, {**base, parameter: ordinary + PLAIN}, reads)
            if plain_n is not None and injected_n > max(plain_n, 1):
                what = "returned" if reads else "changed"
                detail = (
                    f"called with {excerpt(injected)} it {what} {injected_n} rows, with the same text unquoted "
                    f"{plain_n}: the quote ends a string in its SQL"
                )
                failure = ProbeResult.failing(ProbeFailure.SQL_INJECTION_ACCEPTED, tool.name, detail, cause=parameter)
                break
        results.append(failure or ProbeResult.passing(Probe.NO_SQL_FROM_ARGUMENTS, tool.name, "text stays text"))
    return results
