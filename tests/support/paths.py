"""Paths of the checkout the tests run from."""

from __future__ import annotations

from pathlib import Path

#: The repository's root (the folder holding pyproject.toml).
REPO = Path(__file__).resolve().parents[2]
#: The tests folder.
TESTS = REPO / "tests"
#: The hand-written example bundle every layer is tested against.
GOLDEN = REPO / "examples" / "bundles" / "retail_store"
