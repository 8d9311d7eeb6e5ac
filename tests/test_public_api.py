"""The front door (worldsmith/__init__.py): `__all__`, the lazy map `_EXPORTS` and the type checkers'
stub `__init__.pyi` name the same things; every name resolves to what its module defines; importing
the package loads no third-party module; the package itself never imports through its front door; and
the README's "Python API" example runs as written."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.patience import PROCESS_S

import worldsmith

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "worldsmith"


def _target(entry: str, name: str) -> tuple[str, str]:
    module, _, attribute = entry.partition(":")
    return module, attribute or name


def stub_exports(text: str) -> dict[str, tuple[str, str]]:
    """What `__init__.pyi` exports: public name -> (module, name there); `x = _private` follows the alias."""
    imported: dict[str, tuple[str, str]] = {}
    exported: dict[str, tuple[str, str]] = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            for alias in node.names:
                imported[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Name):
            for target in node.targets:
                assert isinstance(target, ast.Name)
                exported[target.id] = imported[node.value.id]
    exported.update({name: found for name, found in imported.items() if not name.startswith("_")})
    return exported


def test_the_three_lists_of_public_names_agree() -> None:
    names = worldsmith.__all__
    assert len(names) == len(set(names)), "a name listed twice in __all__"
    assert set(names) == {"__version__", *worldsmith._EXPORTS}
    lazy = {name: _target(entry, name) for name, entry in worldsmith._EXPORTS.items()}
    assert stub_exports((PACKAGE / "__init__.pyi").read_text()) == lazy
    assert 20 <= len(names) <= 30, "the front door is a small curated API"


@pytest.mark.parametrize("name", sorted(worldsmith._EXPORTS))
def test_every_name_resolves_to_what_its_module_defines(name: str) -> None:
    module, attribute = _target(worldsmith._EXPORTS[name], name)
    value = getattr(worldsmith, name)
    assert value is getattr(importlib.import_module(module), attribute)
    defined = getattr(value, "fn", value)  # a Prefect flow: the function it wraps
    assert defined.__module__ == module, f"{name}: the map names {module}, a re-export of {defined.__module__}"
    assert name in dir(worldsmith)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_name"):
        worldsmith.no_such_name  # noqa: B018
    assert not hasattr(worldsmith, "no_such_name")


LOADED = """
import sys
before = set(sys.modules)
import worldsmith
{then}
print(" ".join(sorted({{m.partition(".")[0] for m in set(sys.modules) - before}})))
"""


def _newly_loaded(then: str = "") -> set[str]:
    """The top-level modules a fresh interpreter loads for `import worldsmith` and then `then`."""
    done = subprocess.run(
        [sys.executable, "-c", LOADED.format(then=then)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=PROCESS_S,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.split())


@pytest.mark.sandbox  # a fresh interpreter per case
@pytest.mark.parametrize(
    "then",
    ["", "worldsmith.WorldsmithError, worldsmith.Verdict, worldsmith.ToolError"],
    ids=["import", "stdlib-names"],
)
def test_importing_the_package_loads_no_third_party_module(then: str) -> None:
    """Nothing heavy (torch, transformers, prefect): nothing outside the standard library at all, also
    after the names whose modules are stdlib only."""
    loaded = _newly_loaded(then)
    assert "worldsmith" in loaded
    assert sorted(loaded - set(sys.stdlib_module_names) - {"worldsmith"}) == []


def test_the_package_never_imports_through_its_front_door() -> None:
    """Modules of the package import a name from the module defining it: the front door reaches every
    layer, so a module importing through it would import upward (tests/test_layers.py)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.module == "worldsmith" and node.level == 0:
                found += [f"{path.relative_to(REPO)}: {a.name}" for a in node.names if a.name in worldsmith._EXPORTS]
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "worldsmith"
                and node.attr in worldsmith._EXPORTS
            ):
                found.append(f"{path.relative_to(REPO)}: worldsmith.{node.attr}")
    assert found == []


def readme_example() -> str:
    """The first Python block of README.md's "Python API" section."""
    section = (REPO / "README.md").read_text().split("\n## Python API\n", 1)[1].split("\n## ", 1)[0]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "README.md's Python API section has no Python block"
    return match[1]


@pytest.mark.sandbox  # opens an episode in a sandbox worker
def test_the_readme_example_runs_as_written(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """It opens the example bundle, calls a tool in an episode of one task and verifies: what it prints
    is what its comments say."""
    code = readme_example()
    assert len(code.strip().splitlines()) <= 12, "the README's example stays about ten lines"
    monkeypatch.chdir(REPO)  # its paths are relative to the checkout
    exec(compile(code, "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("ok {'id': 2, 'order_item_id': 2, 'quantity': 1, ")
    assert printed[-1] == "complete"


@pytest.mark.sandbox
def test_open_bundle_takes_a_directory_or_a_catalog_reference(home: Path) -> None:
    from worldsmith.storage.catalog import open_catalog
    from worldsmith.storage.objectstore import configured_store
    from worldsmith.storage.publish import publish

    example = REPO / "examples" / "bundles" / "retail_store"
    direct = worldsmith.open_bundle(example)
    assert worldsmith.open_bundle(str(example)).key == direct.key
    publish(direct, configured_store(), open_catalog())
    for ref in ("retail_store", "retail_store@1"):
        published = worldsmith.open_bundle(ref)
        assert published.key == direct.key and published.root.is_relative_to(home / "cache" / "bundles")
    with pytest.raises(worldsmith.CatalogError, match="retail_store@2"):
        worldsmith.open_bundle("retail_store@2")
    with pytest.raises(worldsmith.BundleError):  # a path is never looked up in the catalog
        worldsmith.open_bundle("examples/bundles/no_such_world")
