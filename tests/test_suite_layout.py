"""The tests folder mirrors the package: tests/<package>/ for each worldsmith package, and every package
has unit-tier tests (so `pytest -m unit` covers every package)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from support.paths import REPO, TESTS
from support.tiers import TIERS

pytestmark = pytest.mark.unit

PACKAGE = REPO / "worldsmith"
#: Folders of tests/ that are not packages' tests.
NOT_PACKAGES = {"support", "data", "guard_bypass", "kill_after_call", "__pycache__"}
#: Packages that hold no logic to test on their own (data files, or one entry-point shim).
NO_TESTS = {"data", "deployments"}


def _packages() -> set[str]:
    return {p.parent.name for p in PACKAGE.glob("*/__init__.py")}


def _tiers(module: Path) -> set[str]:
    """The tier markers a test module names (module-level `pytestmark` and decorators)."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in TIERS:
            value = node.value
            if isinstance(value, ast.Attribute) and value.attr == "mark":
                found.add(node.attr)
    return found


def test_every_test_folder_is_a_package_of_worldsmith() -> None:
    folders = {p.name for p in TESTS.iterdir() if p.is_dir()} - NOT_PACKAGES
    assert folders <= _packages(), f"tests/ folders that mirror no package: {sorted(folders - _packages())}"


def test_every_package_has_unit_tests() -> None:
    missing = []
    for package in sorted(_packages() - NO_TESTS):
        modules = list((TESTS / package).rglob("test_*.py"))
        if not any("unit" in _tiers(module) for module in modules):
            missing.append(package)
    assert not missing, f"packages without unit-tier tests in tests/<package>/: {missing}"


def test_test_modules_have_unique_names() -> None:
    """pytest imports test modules by their base name (rootdir-relative folders are not packages)."""
    names = [p.name for p in TESTS.rglob("test_*.py")]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_test_modules_import_only_their_own_folders_test_modules() -> None:
    """A folder's tests run alone (`pytest tests/stages`): what tests of several folders share lives in
    tests/support, not in another folder's test module."""
    crossing = []
    for module in TESTS.rglob("test_*.py"):
        here = {p.stem for p in module.parent.glob("test_*.py")}
        for node in ast.walk(ast.parse(module.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            crossing += [
                f"{module.relative_to(TESTS)} imports {n}" for n in names if n.startswith("test_") and n not in here
            ]
    assert not crossing, crossing
