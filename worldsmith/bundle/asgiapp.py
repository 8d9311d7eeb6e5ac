"""The code of an ASGI environment (app.py, a FastAPI app written for the AWM release): its static
check (`check_app_source`, `app_imports`) and its code made ready to run inside the sandbox.
Stdlib only: the sandbox worker imports this module.

Two rewrites of the syntax tree, never of the text (a call split over lines, aliased or
qualified, is found all the same):
- every call of `create_engine(...)` (`from sqlalchemy import create_engine`, `sqlalchemy.create_engine`,
  an alias) becomes a call of `__worldsmith_engine__(...)`, which the worker binds to the episode's
  private in-memory database whatever URL the code asked for;
- every read of the clock through `datetime` (`datetime.now()`, `datetime.utcnow()`, `date.today()`,
  `datetime.datetime.now(tz)`...) becomes a call of `__worldsmith_clock__("datetime.now", ...)`, which
  answers the environment's fixed instant: replays of an episode give the same database;
- the module-level `if __name__ == "__main__":` block (where the release starts uvicorn) is dropped.
"""

from __future__ import annotations

import ast
from types import CodeType

from worldsmith.bundle.codepolicy import FORBIDDEN_BUILTINS, parse_source

ENGINE_FACTORY = "__worldsmith_engine__"
CLOCK = "__worldsmith_clock__"
#: Clock reads an app may make, by class: each becomes `__worldsmith_clock__("class.method", ...)`.
CLOCK_READS = {"datetime": ("now", "utcnow", "today"), "date": ("today",)}


def is_main_guard(node: ast.AST) -> bool:
    """Whether `node` is `if __name__ == "__main__":`."""
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return False
    sides = [node.test.left, node.test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and mains and isinstance(node.test.ops[0], ast.Eq))


def _engine_aliases(tree: ast.Module) -> tuple[set[str], set[str]]:
    """Names bound to sqlalchemy's create_engine, and names bound to the sqlalchemy module."""
    functions: set[str] = {"create_engine"}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "sqlalchemy":
            functions.update(a.asname or a.name for a in node.names if a.name == "create_engine")
        elif isinstance(node, ast.Import):
            modules.update(
                (a.asname or a.name).split(".")[0] for a in node.names if a.name.split(".")[0] == "sqlalchemy"
            )
    return functions, modules


class _EngineCalls(ast.NodeTransformer):
    def __init__(self, functions: set[str], modules: set[str]):
        self.functions, self.modules, self.count = functions, modules, 0

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        direct = isinstance(func, ast.Name) and func.id in self.functions
        qualified = (
            isinstance(func, ast.Attribute)
            and func.attr == "create_engine"
            and isinstance(func.value, ast.Name)
            and func.value.id in self.modules
        )
        if direct or qualified:
            self.count += 1
            node.func = ast.copy_location(ast.Name(id=ENGINE_FACTORY, ctx=ast.Load()), func)
        return node


def _clock_aliases(tree: ast.Module) -> tuple[dict[str, str], set[str]]:
    """Names bound to datetime's `datetime` and `date` classes (name -> class), and names bound to the module."""
    classes: dict[str, str] = {}
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "datetime":
            classes.update({a.asname or a.name: a.name for a in node.names if a.name in CLOCK_READS})
        elif isinstance(node, ast.Import):
            modules.update(a.asname or a.name for a in node.names if a.name == "datetime")
    return classes, modules


class _ClockReads(ast.NodeTransformer):
    """`datetime.now(...)`, `date.today()`, `dt.datetime.utcnow()`... -> `__worldsmith_clock__("datetime.now", ...)`."""

    def __init__(self, classes: dict[str, str], modules: set[str]):
        self.classes, self.modules = classes, modules

    def _class_of(self, node: ast.expr) -> str | None:
        if isinstance(node, ast.Name) and node.id in self.classes:
            return self.classes[node.id]
        if (
            isinstance(node, ast.Attribute)
            and node.attr in CLOCK_READS
            and isinstance(node.value, ast.Name)
            and node.value.id in self.modules
        ):
            return node.attr
        return None

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        func = node.func
        if isinstance(func, ast.Attribute):
            cls = self._class_of(func.value)
            if cls is not None and func.attr in CLOCK_READS[cls]:
                node.args = [ast.copy_location(ast.Constant(f"{cls}.{func.attr}"), func), *node.args]
                node.func = ast.copy_location(ast.Name(id=CLOCK, ctx=ast.Load()), func)
        return node


def app_tree(source: str, filename: str = "app.py") -> tuple[ast.Module, int]:
    """The app's syntax tree with the main block dropped, engine creation and clock reads
    rewritten, and how many `create_engine` calls were rewritten. Raises SyntaxError."""
    tree = parse_source(source, filename)
    assert isinstance(tree, ast.Module)
    tree.body = [node for node in tree.body if not is_main_guard(node)]
    rewriter = _EngineCalls(*_engine_aliases(tree))
    tree = rewriter.visit(tree)
    tree = _ClockReads(*_clock_aliases(tree)).visit(tree)
    ast.fix_missing_locations(tree)
    return tree, rewriter.count


def compile_app(source: str, filename: str = "app.py") -> CodeType:
    """The rewritten app compiled with its original line numbers (errors point into app.py)."""
    tree, _ = app_tree(source, filename)
    return compile(tree, filename, "exec", dont_inherit=True)


def check_app_source(source: str, filename: str = "app.py") -> list[tuple[int, str]]:
    """Static check of an ASGI environment's app (its main block aside): `(line, problem)` for a
    syntax error, no engine, or a use of a forbidden builtin. Imports are the sandbox's business
    at run time (the worker refuses anything outside APP_MODULES); `app_imports` lists them."""
    try:
        tree, engines = app_tree(source, filename)
    except SyntaxError as exc:
        return [(exc.lineno or 1, f"syntax error: {exc.msg}")]
    problems: list[tuple[int, str]] = []
    if engines == 0:
        problems.append(
            (
                1,
                "no create_engine(...) call: the app must create its database engine (it is bound to the episode's database)",
            )
        )
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in FORBIDDEN_BUILTINS - {
            "globals",
            "locals",
            "vars",
            "exit",
            "quit",
            "help",
            "input",
        }:
            problems.append((node.lineno, f"use of {node.id!r} is not allowed"))
    problems.sort()
    return problems


def app_imports(source: str, filename: str = "app.py") -> list[tuple[int, str]]:
    """`(line, module)` of every import of an app outside its main block (syntax errors: none)."""
    try:
        tree, _ = app_tree(source, filename)
    except SyntaxError:
        return []
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.append((node.lineno, node.module or ""))
    return sorted(found)
