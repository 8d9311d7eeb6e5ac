"""One exception tree: every exception class of the package is under `WorldsmithError` (worldsmith/errors.py)
and drawn where it is in the tree of docs/architecture.md ("Errors"), except the few kept outside on
purpose (OUTSIDE). Read from the source with `ast`: nothing of the package is imported, no process started."""

from __future__ import annotations

import ast
import builtins
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "worldsmith"
ARCHITECTURE = REPO / "docs" / "architecture.md"
ROOT = "worldsmith.errors.WorldsmithError"

#: Exceptions outside the root on purpose, and why (docs/architecture.md names them too).
OUTSIDE: dict[str, str] = {
    "worldsmith.runtime.sandbox.guard.SandboxViolation": "a BaseException, so that generated code's "
    "`except Exception` cannot swallow it; it never leaves the sandbox worker",
    "worldsmith.runtime.sandbox.failure.Failure": "the worker's outcome of an operation, sent as its reply; "
    "it never leaves the worker process",
    "worldsmith.runtime.sandbox.template.TemplateLost": "the worker's template process is gone: the worker "
    "says so on stderr and exits; it never leaves the worker process",
    "worldsmith.quality.tool_calls.Stopped": "control flow of the deep probes: raised by the prober, caught by deep_probes",
}

#: Third-party bases of the package's classes known not to be exceptions: no need to import them (the
#: training stack is slow to import) to tell. Any other third-party base is imported and asked.
NOT_EXCEPTIONS = frozenset(
    {
        "pydantic.BaseModel",
        "pydantic_settings.BaseSettings",
        "pydantic_settings.TomlConfigSettingsSource",
        "sqlmodel.SQLModel",
        "transformers.TrainerCallback",
        "trl.GRPOTrainer",
        "typer.core.TyperGroup",
    }
)


@dataclass(frozen=True)
class ClassInfo:
    module: str
    name: str
    bases: tuple[str, ...]  # qualified: `worldsmith.llm.errors.GenerationFault`, `builtins.ValueError`

    @property
    def qualname(self) -> str:
        return f"{self.module}.{self.name}"


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


class Source:
    """The classes and imported names of every module of the package at `root`, from its source."""

    def __init__(self, root: Path):
        self.package = root.name
        self.names: dict[str, dict[str, str]] = {}  # module -> {local name: qualified name}
        self.classes: dict[str, ClassInfo] = {}  # qualified name -> class
        trees = {_module_name(p, root): ast.parse(p.read_text(), str(p)) for p in sorted(root.rglob("*.py"))}
        for module, tree in trees.items():
            self.names[module] = self._bindings(module, tree)
        for module, tree in trees.items():
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = tuple(self._base(module, base) for base in node.bases)
                    self.classes.setdefault(f"{module}.{node.name}", ClassInfo(module, node.name, bases))

    def _bindings(self, module: str, tree: ast.Module) -> dict[str, str]:
        names: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                origin = node.module or ""
                if node.level:  # relative: from the module's own package up
                    package = module.split(".")[: -node.level]
                    origin = ".".join([*package, origin] if origin else package)
                for alias in node.names:
                    names[alias.asname or alias.name] = f"{origin}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        names[alias.asname] = alias.name
                    else:
                        names[alias.name.split(".")[0]] = alias.name.split(".")[0]
            elif isinstance(node, ast.ClassDef):
                names[node.name] = f"{module}.{node.name}"
        return names

    def _base(self, module: str, node: ast.expr) -> str:
        """The qualified name of base expression `node` in `module` (`Generic[T]` -> `typing.Generic`)."""
        if isinstance(node, ast.Subscript):
            node = node.value
        dotted = ast.unparse(node)
        head, _, rest = dotted.partition(".")
        if head in self.names[module]:
            qualified = self.names[module][head]
        elif hasattr(builtins, head):
            qualified = f"builtins.{head}"
        else:
            qualified = f"{module}.{head}"
        return self.canonical(f"{qualified}.{rest}" if rest else qualified)

    def canonical(self, qualified: str) -> str:
        """Where a name of the package is defined (`worldsmith.runtime.ToolError` ->
        `worldsmith.runtime.errors.ToolError`); names outside the package as they are."""
        seen: set[str] = set()
        while qualified.split(".")[0] == self.package and qualified not in seen:
            seen.add(qualified)
            module, _, name = qualified.rpartition(".")
            if module not in self.names or "." in name:
                return qualified
            bound = self.names[module].get(name, qualified)
            if bound == qualified:
                return qualified
            qualified = bound
        return qualified

    def is_exception(self, qualified: str) -> bool:
        if qualified in self.classes:
            return any(self.is_exception(base) for base in self.classes[qualified].bases)
        if qualified in NOT_EXCEPTIONS or qualified.split(".")[0] == self.package:
            return False
        module, _, name = qualified.rpartition(".")
        try:
            found = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError):
            return False
        return isinstance(found, type) and issubclass(found, BaseException)

    def ancestors(self, qualified: str) -> set[str]:
        found: set[str] = set()
        frontier = [qualified]
        while frontier:
            for base in self.classes.get(frontier.pop(), ClassInfo("", "", ())).bases:
                if base not in found:
                    found.add(base)
                    frontier.append(base)
        return found

    def exceptions(self) -> list[ClassInfo]:
        return [info for name, info in sorted(self.classes.items()) if self.is_exception(name)]


@dataclass(frozen=True)
class Drawn:
    """One line of the drawn tree: a class, its parent in the tree, its other bases, its module."""

    name: str
    parent: str | None
    extra_bases: tuple[str, ...]
    module: str  # dotted: worldsmith.bundle.errors


_LINE = re.compile(r"^(?P<indent>[│├└─ ]*)(?P<name>\w+)(?: \[(?P<bases>[\w, ]+)\])?\s+(?P<path>[\w/]+\.py)\b")


def drawn_tree(markdown: str, package: str = "worldsmith") -> list[Drawn]:
    """The tree drawn in the first ```text block of the "## Errors" section (4 columns per level), its
    paths relative to `package`."""
    section = markdown.split("\n## Errors\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```text\n", 1)[1].split("```", 1)[0]
    drawn: list[Drawn] = []
    path: list[str] = []  # the names of the current line's ancestors, root first
    for line in block.splitlines():
        match = _LINE.match(line)
        assert match, f"a line of the drawn tree reads as no class: {line!r}"
        depth = len(match["indent"]) // 4
        path = path[:depth] + [match["name"]]
        bases = tuple(b.strip() for b in match["bases"].split(",")) if match["bases"] else ()
        module = f"{package}." + match["path"].removesuffix(".py").replace("/", ".")
        drawn.append(Drawn(match["name"], path[-2] if depth else None, bases, module))
    return drawn


def tree_problems(source: Source, drawn: list[Drawn], root: str, outside: dict[str, str]) -> list[str]:
    """What differs between the code's exception classes and the drawn tree, one line each."""
    problems: list[str] = []
    where = {f"{d.module}.{d.name}": d for d in drawn}
    by_name = {d.name: f"{d.module}.{d.name}" for d in drawn}
    for info in source.exceptions():
        name = info.qualname
        if name in outside:
            if root in source.ancestors(name):
                problems.append(f"{name} is under the root but kept outside it (OUTSIDE)")
            continue
        if name != root and root not in source.ancestors(name):
            problems.append(f"{name} is not under {root}")
        if name not in where:
            problems.append(f"{name} is not in the drawn tree")
    for name, line in where.items():
        info = source.classes.get(name)
        if info is None:
            problems.append(f"{line.name} is drawn in {line.module}, which defines no such class")
            continue
        parent = by_name.get(line.parent) if line.parent else None
        if parent is not None and parent not in info.bases:
            problems.append(f"{name} is drawn under {line.parent}, which is not one of its bases")
        others = tuple(b.removeprefix("builtins.") for b in info.bases if b != parent)
        if line.parent and others != line.extra_bases:
            problems.append(f"{name}: its other bases are {list(others)}, drawn as {list(line.extra_bases)}")
    for name in outside:
        if name not in source.classes or not source.is_exception(name):
            problems.append(f"{name} (OUTSIDE) is no exception class of the package")
    return problems


@pytest.fixture(scope="module")
def source() -> Source:
    return Source(PACKAGE)


def test_every_exception_descends_from_the_root_as_the_drawn_tree_shows(source: Source) -> None:
    drawn = drawn_tree(ARCHITECTURE.read_text())
    assert drawn[0].name == "WorldsmithError" and drawn[0].parent is None
    assert tree_problems(source, drawn, ROOT, OUTSIDE) == []


def test_the_reader_finds_the_exceptions_it_should(source: Source) -> None:
    """Through an intermediate class, a re-export and a stdlib base; not a pydantic model; a stdlib
    base that is no builtin is imported and asked."""
    assert source.canonical("worldsmith.runtime.ToolError") == "worldsmith.runtime.errors.ToolError"
    assert ROOT in source.ancestors("worldsmith.llm.errors.EndpointAuthFault")
    assert source.is_exception("worldsmith.storage.objectstore.ObjectMissing")
    assert not source.is_exception("worldsmith.models.results.ToolResult")
    assert source.is_exception("json.JSONDecodeError") and not source.is_exception("enum.StrEnum")
    assert len(source.exceptions()) >= 45


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """On a made-up package: an exception off the root, one not drawn, one drawn under the wrong
    parent, one whose stdlib base is drawn wrong, and a drawn class that does not exist."""
    root = tmp_path / "pkg"
    files = {
        "__init__.py": "",
        "errors.py": "class RootError(Exception):\n    pass\n",
        "a.py": "from pkg.errors import RootError\n\nclass AError(RootError, ValueError):\n    pass\n",
        "b.py": "import pkg.a as a\n\nclass BError(a.AError):\n    pass\n\nclass Stray(KeyError):\n    pass\n",
        "c.py": "from pkg.errors import RootError\n\nclass CError(RootError):\n    pass\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    markdown = (
        "# Made up\n\n## Errors\n\n```text\n"
        "RootError                  errors.py\n"
        "├── AError [KeyError]      a.py\n"
        "├── CError                 c.py\n"
        "│   └── BError             b.py\n"
        "└── Ghost                  c.py\n"
        "```\n"
    )
    problems = tree_problems(Source(root), drawn_tree(markdown, "pkg"), "pkg.errors.RootError", {})
    assert problems == [
        "pkg.b.Stray is not under pkg.errors.RootError",
        "pkg.b.Stray is not in the drawn tree",
        "pkg.a.AError: its other bases are ['ValueError'], drawn as ['KeyError']",
        "pkg.b.BError is drawn under CError, which is not one of its bases",
        "pkg.b.BError: its other bases are ['pkg.a.AError'], drawn as []",
        "Ghost is drawn in pkg.c, which defines no such class",
    ]
