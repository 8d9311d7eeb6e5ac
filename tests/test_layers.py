"""The package's dependencies point one way: models, bundle <- storage, llm, runtime <- quality,
agent <- stages, training, worldmodel, interop, serving, integrations <- tasks <- flows <- the entry points (cli, demo,
dashboard, ops). Read from the source with `ast` (nothing is imported): no import cycles at module
level, no package importing one above it or importing the other way round a package that imports it,
Prefect only in tasks/, flows/ and the entry points, and runtime/ reaching neither Prefect nor storage."""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.paths import REPO

pytestmark = pytest.mark.unit

PACKAGE = REPO / "worldsmith"

#: Packages (and top-level modules) of worldsmith by layer, lowest first; a module may import its
#: own layer and the ones below.
LAYERS: tuple[frozenset[str], ...] = (
    frozenset(
        {
            "",
            "settings",
            "errors",
            "failures",
            "jsonvalue",
            "toolschema",
            "localserver",
            "secret_block",
            "data",
            "models",
            "bundle",
        }
    ),
    frozenset({"storage", "llm", "runtime"}),
    frozenset({"quality", "agent"}),
    frozenset({"stages", "training", "worldmodel", "interop", "serving", "integrations"}),
    frozenset({"tasks"}),
    frozenset({"flows"}),
    frozenset({"cli", "demo", "dashboard", "ops"}),
)
#: Where Prefect may be imported: its tasks, its flows, the entry points (the top layer), and the model key's
#: Secret block (secret_block.py, imported by settings only inside llm_key).
PREFECT_USERS = frozenset({"tasks", "flows", "secret_block"}) | LAYERS[-1]

Imports = dict[str, dict[str, bool]]  # module -> {imported name: at module level (not only inside a function)}


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(node: ast.AST) -> Iterator[str]:
    if isinstance(node, ast.Import):
        yield from (alias.name for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        yield node.module
        yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _walk(node: ast.AST, top: bool) -> Iterator[tuple[str, bool]]:
    """(imported name, at module level) of every import below `node`; function bodies are not module level."""
    for child in ast.iter_child_nodes(node):
        yield from ((name, top) for name in _imported(child))
        yield from _walk(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))


def read_imports(root: Path) -> Imports:
    """For every module of the package at `root`: the names it imports (modules of the package
    resolved to the module defining them; others kept as written)."""
    sources = {module_name(path, root): path for path in sorted(root.rglob("*.py"))}

    def resolve(name: str) -> str | None:
        while name and name not in sources:
            name = name.rpartition(".")[0]
        return name or None

    imports: Imports = {}
    for module, path in sources.items():
        found: dict[str, bool] = {}
        for name, top in _walk(ast.parse(path.read_text(), str(path)), True):
            target = resolve(name) if name.split(".")[0] == root.name else name
            if target and target != module:
                found[target] = found.get(target, False) or top
        imports[module] = found
    return imports


def package_of(module: str) -> str:
    """`worldsmith.training.trainer` -> `training`; the root package -> ``."""
    return module.partition(".")[2].split(".")[0]


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of `graph` with more than one node (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def module_cycles(imports: Imports) -> list[list[str]]:
    """Import cycles among modules through module-level imports."""
    return cycles({m: {t for t, top in found.items() if top and t in imports} for m, found in imports.items()})


def package_cycles(imports: Imports) -> list[list[str]]:
    """Cycles among packages through any import."""
    graph: dict[str, set[str]] = {}
    for module, found in imports.items():
        graph.setdefault(package_of(module), set()).update(package_of(t) for t in found if t in imports)
    return cycles(graph)


def upward_imports(imports: Imports) -> list[str]:
    """`module -> imported` for every import (at any level) of a package in a higher layer."""
    layer = {name: rank for rank, names in enumerate(LAYERS) for name in names}
    return sorted(
        f"{m} -> {t}"
        for m, found in imports.items()
        for t in found
        if t in imports and layer[package_of(t)] > layer[package_of(m)]
    )


def prefect_outside(imports: Imports) -> list[str]:
    """Modules outside PREFECT_USERS that import Prefect (at any level)."""
    return sorted(
        m
        for m, found in imports.items()
        if package_of(m) not in PREFECT_USERS and any(t.split(".")[0] == "prefect" for t in found)
    )


@pytest.fixture(scope="module")
def imports() -> Imports:
    return read_imports(PACKAGE)


def test_every_package_has_a_layer(imports: Imports) -> None:
    assert {package_of(m) for m in imports} <= set().union(*LAYERS)


def test_no_import_cycles(imports: Imports) -> None:
    assert module_cycles(imports) == []
    assert package_cycles(imports) == []


def test_no_package_imports_upward(imports: Imports) -> None:
    """In particular nothing below flows/ imports flows/ (not even inside a function)."""
    assert upward_imports(imports) == []


def test_prefect_is_imported_only_by_tasks_flows_or_entry_points(imports: Imports) -> None:
    assert prefect_outside(imports) == []


def test_runtime_reaches_neither_prefect_nor_storage(imports: Imports) -> None:
    """What runtime/ imports, and what that imports at module level, in turn: no Prefect, no storage."""
    seen: set[str] = set()
    frontier = [m for m in imports if package_of(m) == "runtime"]
    while frontier:
        module = frontier.pop()
        if module in seen:
            continue
        seen.add(module)
        own = package_of(module) == "runtime"  # runtime's own imports count wherever they are
        frontier += [t for t, top in imports[module].items() if t in imports and (top or own)]
    reached = {package_of(m) for m in seen}
    # the lowest layer but its Prefect secret and local-server helpers, and runtime itself
    assert reached <= (LAYERS[0] - {"localserver", "secret_block"}) | {"runtime"}
    assert not [m for m in seen if any(t.split(".")[0] == "prefect" for t in imports[m])]


#: The sandbox worker's entry point (runtime/pool.py's bootstrap imports it, then calls its `main`).
SANDBOX_WORKER = "worldsmith.runtime.sandbox.worker"
#: The one module of the package the worker imports later than at module level: ASGI workers' web stack
#: (`worker._preload` imports it before the worker confines itself; stdlib workers never do).
SANDBOX_LATE = frozenset({"worldsmith.runtime.sandbox.asgi"})


def sandbox_worker_modules(imports: Imports) -> set[str]:
    """The package's modules a sandbox worker loads when it starts: what worker.py imports at module
    level, and what those import at module level in turn, with the packages that hold them."""
    seen: set[str] = set()
    frontier = [SANDBOX_WORKER]
    while frontier:
        module = frontier.pop()
        if module in seen:
            continue
        seen.add(module)
        parents = [module.rsplit(".", depth)[0] for depth in range(1, module.count(".") + 1)]
        frontier += [t for t, top in imports[module].items() if top and t in imports] + parents
    return seen


def test_the_sandbox_worker_loads_its_modules_before_it_confines_itself(imports: Imports) -> None:
    """A worker starts without site-packages (`python -I -S`) and, once confined, reads no file outside
    the standard library: every module of the package it runs is loaded at its start (asgi aside), and
    those import nothing but the standard library at module level."""
    loaded = sandbox_worker_modules(imports)
    assert {"worldsmith.runtime.sandbox.guard", "worldsmith.runtime.sandbox.operations"} <= loaded
    later = {t for m in loaded for t, top in imports[m].items() if t in imports and not top and t not in loaded}
    assert later <= SANDBOX_LATE
    outside = {t for m in loaded for t, top in imports[m].items() if top and t not in imports}
    assert {name.split(".")[0] for name in outside} <= set(sys.stdlib_module_names)


#: The most lines a module may have: a reader holds it in one sitting (docs/architecture.md, "Module size").
MODULE_LINES = 600
#: Data tables, which are read by row, not held whole.
DATA_TABLES = frozenset({"llm/procedural/blocks.py"})


def test_no_module_is_longer_than_a_reader_can_hold() -> None:
    long = {
        str(path.relative_to(PACKAGE)): lines
        for path in PACKAGE.rglob("*.py")
        if (lines := len(path.read_text().splitlines())) > MODULE_LINES
    }
    assert set(long) <= DATA_TABLES, f"modules over {MODULE_LINES} lines: split them along their seams: {long}"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """On a made-up package: a module-level cycle, an upward import inside a function, Prefect in storage."""
    root = tmp_path / "worldsmith"
    files = {
        "__init__.py": "",
        "models/__init__.py": "",
        "models/a.py": "from worldsmith.models.b import B\nA = 1\n",
        "models/b.py": "from worldsmith.models.a import A\nB = 2\n",
        "storage/__init__.py": "",
        "storage/records.py": "import prefect\n\ndef f():\n    from worldsmith.flows.run import g\n",
        "flows/__init__.py": "",
        "flows/run.py": "from worldsmith.storage.records import f\n\ndef g():\n    pass\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    found = read_imports(root)
    assert module_cycles(found) == [["worldsmith.models.a", "worldsmith.models.b"]]
    assert package_cycles(found) == [["flows", "storage"]]
    assert upward_imports(found) == ["worldsmith.storage.records -> worldsmith.flows.run"]
    assert prefect_outside(found) == ["worldsmith.storage.records"]
