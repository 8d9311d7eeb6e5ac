"""What generated code (tools.py, verifiers.py) may import and touch.

Stdlib only: the sandbox worker imports this module. The loader applies `check_source`
statically; the worker enforces the same allowlist at run time through restricted builtins.
"""

from __future__ import annotations

import ast
import threading
from typing import Literal, overload

# CPython 3.11's AST constructor keeps its recursion bookkeeping per interpreter, and concurrent
# ast.parse calls from threads can corrupt it ("AST constructor recursion depth mismatch", CPython
# gh-106905). Ours take this lock; parses we do not own (the traceback module's caret anchors, a
# library's) can still interleave, so such a SystemError is retried: the parse itself is deterministic.
_PARSE_LOCK = threading.Lock()
_MISMATCH = "recursion depth mismatch"
_PARSE_TRIES = 5


#: How deeply a syntax tree of generated code may nest. Deeper trees are refused before anything
#: walks them recursively (ast.NodeVisitor, ast.unparse, compile), which would raise RecursionError.
MAX_NESTING = 200
TOO_DEEP = "too deeply nested to parse"


@overload
def parse_source(source: str, filename: str = ..., mode: Literal["exec"] = ...) -> ast.Module: ...
@overload
def parse_source(source: str, filename: str = ..., *, mode: Literal["eval"]) -> ast.Expression: ...


def parse_source(source: str, filename: str = "<generated>", mode: str = "exec") -> ast.AST:
    """ast.parse, one call at a time in this process. Pathological nesting (which makes the parser
    or the AST constructor raise RecursionError or MemoryError, or yields a tree deeper than
    `MAX_NESTING`) is a SyntaxError too, "too deeply nested to parse", so callers report it as one."""
    with _PARSE_LOCK:
        for tries_left in reversed(range(_PARSE_TRIES)):
            try:
                tree = ast.parse(source, filename=filename, mode=mode)
                break
            except (RecursionError, MemoryError):
                raise SyntaxError(TOO_DEEP, (filename, 1, 0, None)) from None
            except SystemError as exc:
                if _MISMATCH not in str(exc) or not tries_left:
                    raise
    depth, line = _nesting(tree)
    if depth > MAX_NESTING:
        raise SyntaxError(f"{TOO_DEEP} (more than {MAX_NESTING} levels)", (filename, line, 0, None))
    return tree


def _nesting(tree: ast.AST) -> tuple[int, int]:
    """The depth of `tree` and the line where it is deepest, without recursion."""
    deepest, line = 0, 1
    stack = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > deepest:
            deepest, line = depth, getattr(node, "lineno", line)
            if deepest > MAX_NESTING:
                break
        stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return deepest, line


#: Top-level modules generated code may import.
ALLOWED_MODULES: frozenset[str] = frozenset(
    {
        "__future__",
        "abc",
        "base64",
        "bisect",
        "calendar",
        "collections",
        "copy",
        "dataclasses",
        "datetime",
        "decimal",
        "difflib",
        "enum",
        "fractions",
        "functools",
        "hashlib",
        "heapq",
        "itertools",
        "json",
        "math",
        "numbers",
        "operator",
        "pathlib",
        "random",
        "re",
        "sqlite3",
        "statistics",
        "string",
        "textwrap",
        "time",
        "typing",
        "unicodedata",
        "uuid",
    }
)

#: Top-level modules the code of an ASGI environment (app.py, a FastAPI app) may import besides
#: ALLOWED_MODULES: the web stack it is written against. `os` is a stand-in whose environment is
#: empty and records reads of secret-looking names (see runtime/sandbox/asgi.py).
APP_MODULES: frozenset[str] = ALLOWED_MODULES | frozenset(
    {"fastapi", "pydantic", "sqlalchemy", "starlette", "typing_extensions", "annotated_types", "os", "email_validator"}
)

#: The runtime's own module, importable only for its ToolError and `now` (the world's clock).
RUNTIME_MODULE = "worldsmith.runtime"
RUNTIME_NAMES: frozenset[str] = frozenset({"ToolError", "now"})

#: Builtins removed from generated code's namespace.
FORBIDDEN_BUILTINS: frozenset[str] = frozenset(
    {
        "__import__",
        "breakpoint",
        "compile",
        "delattr",
        "eval",
        "exec",
        "exit",
        "globals",
        "help",
        "input",
        "locals",
        "memoryview",
        "open",
        "quit",
        "vars",
    }
)

#: Names that may not appear in generated code at all.
FORBIDDEN_NAMES: frozenset[str] = FORBIDDEN_BUILTINS | {"__builtins__", "__loader__", "__spec__"}

#: Dunder attributes generated code may use (everything else double-underscored is refused).
ALLOWED_DUNDERS: frozenset[str] = frozenset(
    {
        "__init__",
        "__name__",
        "__doc__",
        "__str__",
        "__repr__",
        "__len__",
        "__eq__",
        "__hash__",
        "__iter__",
        "__next__",
        "__contains__",
        "__getitem__",
        "__enter__",
        "__exit__",
        "__lt__",
        "__main__",
    }
)


def is_dunder(name: str) -> bool:
    return len(name) > 4 and name.startswith("__") and name.endswith("__")


def module_allowed(name: str) -> bool:
    """True if `import name` is allowed for generated code."""
    return name == RUNTIME_MODULE or name.split(".")[0] in ALLOWED_MODULES


def check_source(source: str, filename: str) -> list[tuple[int, str]]:
    """Static policy check of generated code: `(line, problem)` for every violation, [] if clean.

    A syntax error is reported as a violation at its line.
    """
    try:
        tree = parse_source(source, filename)
    except SyntaxError as exc:
        return [(exc.lineno or 1, f"syntax error: {exc.msg}")]
    problems: list[tuple[int, str]] = []
    allowed = ", ".join(sorted(ALLOWED_MODULES))
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1)
        if isinstance(node, ast.Import):
            for alias in node.names:
                if not module_allowed(alias.name) or alias.name == RUNTIME_MODULE:
                    problems.append((line, f"import of {alias.name!r} is not allowed (allowed: {allowed})"))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                problems.append((line, "relative imports are not allowed"))
            elif module == RUNTIME_MODULE:
                extra = sorted({a.name for a in node.names} - RUNTIME_NAMES)
                if extra:
                    refused = ", ".join(extra)
                    problems.append(
                        (line, f"only ToolError may be imported from {RUNTIME_MODULE}, or now (not {refused})")
                    )
            elif not module_allowed(module):
                problems.append((line, f"import from {module!r} is not allowed (allowed: {allowed})"))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append((line, f"use of {node.id!r} is not allowed"))
        elif isinstance(node, ast.Attribute) and is_dunder(node.attr) and node.attr not in ALLOWED_DUNDERS:
            problems.append((line, f"access to attribute {node.attr!r} is not allowed"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and node.args[1].value.startswith("_")
        ):
            problems.append((line, f"{node.func.id}() of private attribute {node.args[1].value!r} is not allowed"))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and is_dunder(node.value)
            and node.value not in ALLOWED_DUNDERS
        ):
            problems.append((line, f"string naming the attribute {node.value!r} is not allowed"))
        elif isinstance(node, ast.AsyncFunctionDef):
            problems.append((line, f"async function {node.name!r}: tools and verifiers must be plain functions"))
    problems.sort()
    return problems
