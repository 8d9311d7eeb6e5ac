"""Derive `tools.json` from the signatures and docstrings of `tools.py`, statically (nothing is executed).

A tool is a public top-level function whose first parameter is the episode's connection; every
other parameter needs a type annotation and a line in the docstring's `Args:` section.
"""

from __future__ import annotations

import ast
import re

from worldsmith.bundle.codepolicy import parse_source
from worldsmith.bundle.errors import BundleIssue
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject, JsonValue

FILE = "tools.py"
_SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns|Return|Raises|Yields|Examples?|Notes?):\s*$")
_ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SCALARS: dict[str, JsonObject] = {
    "str": {"type": "string"},
    "int": {"type": "integer"},
    "float": {"type": "number"},
    "bool": {"type": "boolean"},
    "dict": {"type": "object"},
    "list": {"type": "array"},
    "Any": {},
    "None": {"type": "null"},
}


class UnsupportedAnnotation(WorldsmithError, ValueError):
    """A type annotation no JSON Schema is written for; the message is the annotation's source."""


def annotation_schema(node: ast.expr) -> JsonObject:
    """JSON Schema of a type annotation written as an AST; UnsupportedAnnotation for one it cannot express."""
    if isinstance(node, ast.Constant) and node.value is None:
        return {"type": "null"}
    if isinstance(node, ast.Constant) and isinstance(node.value, str):  # string annotation
        return annotation_schema(parse_source(node.value, mode="eval").body)
    if isinstance(node, ast.Name) and node.id in _SCALARS:
        return dict(_SCALARS[node.id])
    if isinstance(node, ast.Attribute) and node.attr in _SCALARS:  # typing.Any
        return dict(_SCALARS[node.attr])
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([node.left, node.right])
    if isinstance(node, ast.Subscript):
        base = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        args = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base in {"list", "List", "Sequence", "set", "Set", "tuple", "Tuple"}:
            items = args[0]
            return {"type": "array", "items": annotation_schema(items)}
        if base in {"dict", "Dict", "Mapping"} and len(args) == 2:
            return {"type": "object", "additionalProperties": annotation_schema(args[1])}
        if base == "Optional":
            return _union([args[0], ast.Constant(value=None)])
        if base == "Union":
            return _union(args)
        if base == "Literal":
            values = [ast.literal_eval(a) for a in args]
            schema: JsonObject = {"enum": values}
            kinds = {type(v) for v in values}
            if len(kinds) == 1:
                schema["type"] = {str: "string", int: "integer", bool: "boolean", float: "number"}.get(
                    kinds.pop(), "string"
                )
            return schema
    raise UnsupportedAnnotation(ast.unparse(node))


def _union(members: list[ast.expr]) -> JsonObject:
    schemas: list[JsonObject] = []
    for member in members:
        schema = annotation_schema(member)
        nested = schema.get("anyOf")  # a union's own members (made below: schemas)
        schemas.extend([s for s in nested if isinstance(s, dict)] if isinstance(nested, list) else [schema])
    types: list[JsonValue] = [s.get("type") for s in schemas]
    if all(isinstance(t, str) for t in types) and all(set(s) == {"type"} for s in schemas):
        return {"type": types}
    return {"anyOf": [*schemas]}


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a Google-style docstring into its description and `{argument: description}`."""
    description: list[str] = []
    args: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    arg_indent: int | None = None
    for raw in doc.splitlines():
        heading = _SECTION.match(raw)
        if heading:
            section, current, arg_indent = heading.group(1).lower(), None, None
            continue
        if section is None:
            description.append(raw.strip())
        elif section in {"args", "arguments", "parameters"} and raw.strip():
            indent = len(raw) - len(raw.lstrip())
            match = _ARG_LINE.match(raw)
            if match and (arg_indent is None or indent <= arg_indent):
                arg_indent = indent
                current = match.group(1)
                args[current] = match.group(2).strip()
            elif current:
                args[current] = (args[current] + " " + raw.strip()).strip()
    text = " ".join(line for line in description if line).strip()
    return text, args


def derive_tool_schemas(source: str) -> tuple[list[JsonObject], list[BundleIssue]]:
    """`tools.json` entries for every tool in `source` ({"name", "description", "parameters"}: a
    `models.bundle.ToolSchema` as JSON), and every defect that prevents one."""
    issues: list[BundleIssue] = []
    try:
        tree = parse_source(source, FILE)
    except SyntaxError as exc:
        return [], [BundleIssue(FILE, f"syntax error: {exc.msg}", exc.lineno)]
    tools: list[JsonObject] = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
            continue
        where = node.lineno
        name = node.name
        params = node.args.posonlyargs + node.args.args
        if node.args.vararg or node.args.kwarg:
            issues.append(
                BundleIssue(FILE, f"tool {name!r}: *args/**kwargs are not allowed; name every argument", where)
            )
            continue
        if not params:
            issues.append(
                BundleIssue(FILE, f"tool {name!r}: the first parameter must be the database connection", where)
            )
            continue
        doc = ast.get_docstring(node)
        if not doc:
            issues.append(BundleIssue(FILE, f"tool {name!r} has no docstring", where))
            continue
        description, documented = parse_docstring(doc)
        if not description:
            issues.append(
                BundleIssue(FILE, f"tool {name!r}: the docstring has no description before its sections", where)
            )
        arguments = params[1:] + node.args.kwonlyargs
        positional_defaults = dict(zip([a.arg for a in params][::-1], node.args.defaults[::-1]))
        keyword_defaults = {a.arg: d for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults) if d is not None}
        defaults = positional_defaults | keyword_defaults
        properties: JsonObject = {}
        required: list[JsonValue] = []
        for arg in arguments:
            line = arg.lineno
            if arg.annotation is None:
                issues.append(BundleIssue(FILE, f"tool {name!r}: argument {arg.arg!r} has no type annotation", line))
                continue
            if arg.arg not in documented or not documented[arg.arg]:
                issues.append(
                    BundleIssue(
                        FILE,
                        f"tool {name!r}: argument {arg.arg!r} is not documented in the docstring's Args: section",
                        line,
                    )
                )
                continue
            try:
                schema = annotation_schema(arg.annotation)
            except (UnsupportedAnnotation, ValueError, SyntaxError) as exc:
                issues.append(
                    BundleIssue(
                        FILE, f"tool {name!r}: argument {arg.arg!r} has an unsupported type annotation {exc}", line
                    )
                )
                continue
            schema["description"] = documented[arg.arg]
            if arg.arg in defaults:
                try:
                    schema["default"] = ast.literal_eval(defaults[arg.arg])
                except ValueError:
                    issues.append(BundleIssue(FILE, f"tool {name!r}: default of {arg.arg!r} must be a literal", line))
            else:
                required.append(arg.arg)
            properties[arg.arg] = schema
        stray = sorted(set(documented) - {a.arg for a in arguments} - {params[0].arg})
        if stray:
            issues.append(
                BundleIssue(FILE, f"tool {name!r}: docstring documents unknown argument(s) {', '.join(stray)}", where)
            )
        tools.append(
            {
                "name": name,
                "description": description,
                "parameters": {
                    "type": "object",
                    "properties": properties,
                    "required": required,
                    "additionalProperties": False,
                },
            }
        )
    if not tools and not issues:
        issues.append(BundleIssue(FILE, "defines no tools (public top-level functions)"))
    return tools, issues


def function_signatures(source: str) -> dict[str, tuple[int, int]]:
    """`{name: (line, number of positional parameters)}` for the top-level functions of `source`."""
    tree = parse_source(source)
    return {
        node.name: (node.lineno, len(node.args.posonlyargs + node.args.args))
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
    }
