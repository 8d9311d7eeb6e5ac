"""A stand-in for an escape past the Python guard, for tests of the layers under it.

A test starts sandbox workers with a bootstrap that imports this module before the worker's `main`
(`tests/runtime/test_isolation.py` patches `worldsmith.runtime.worker_launch._BOOTSTRAP`). It gives generated code one
extra builtin, `unguarded(attack)`: `attack(kit)` runs with the guard's audit hook stepped aside and
with `kit` holding the real `__import__` and `open`. That is what a working guard bypass would give
an attacker; whatever `attack` still cannot do is stopped by the kernel layers and the process
structure, which is what the tests assert. Production workers never import this module.
"""

from __future__ import annotations

import builtins
from typing import Any

from worldsmith.runtime.sandbox import guard

_namespace = guard.Guard.namespace


def unguarded(attack: Any) -> Any:
    sandbox = guard.GUARD
    was = sandbox.active
    sandbox.active = False
    try:
        return attack({"import": builtins.__import__, "open": builtins.open})
    finally:
        sandbox.active = was


def namespace(self: guard.Guard, name: str) -> dict[str, Any]:
    names = _namespace(self, name)
    names["unguarded"] = unguarded
    return names


guard.Guard.namespace = namespace  # type: ignore[method-assign]
