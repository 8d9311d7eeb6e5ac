"""The root of worldsmith's exceptions. Stdlib only and importing nothing: the sandbox worker loads it
(through runtime/errors.py, bundle/kinds.py, ...) in an interpreter without site-packages.

Every exception the package raises for its callers derives from `WorldsmithError`, beside the stdlib
base it always had (`class BundleError(WorldsmithError, ValueError)`: `except ValueError` still catches
it). Each class lives in the layer that raises it; docs/architecture.md ("Errors") draws the tree and
names the few exceptions outside it on purpose; tests/test_error_tree.py holds the two together.
"""

from __future__ import annotations


class WorldsmithError(Exception):
    """Anything worldsmith raises on purpose; `except WorldsmithError` catches every one of them."""
