"""Read-only views of allowed modules: what `import X` gives generated code in a stdlib worker. Stdlib only.

A real module exposes more than its public API: other modules it imported (`pathlib.os`,
`os.sys`, `random._os`) lead from an allowed module to `sys.modules`, the worker's own modules and
its guard. A view holds the module's public attributes only; attributes that are modules appear as
views of allowed modules, and modules outside the allowlist are absent. Views are read-only:
rebinding or deleting an attribute is refused (the guard records a `module_state` violation), so one
episode's code cannot change what another episode's code imports. Objects reached through a view
are the real ones (classes, functions): their own attributes are covered by the guard's fingerprint
and static checks, not by the view. A few attributes are replaced (`overrides`): the views of
`datetime` and `time` read the world's clock (worldsmith/runtime/sandbox/worldclock.py).
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from typing import Any

#: Dunder attributes a view keeps (the rest, like every private name, stays behind).
KEPT_DUNDERS = frozenset({"__name__", "__doc__", "__all__"})


class ModuleView(types.ModuleType):
    """A read-only view of one module (see the module docstring)."""

    def __setattr__(self, name: str, value: Any) -> None:
        refuse_change(f"modified module state: {self.__name__}.{name} (modules are read-only to generated code)")

    def __delattr__(self, name: str) -> None:
        refuse_change(f"modified module state: del {self.__name__}.{name} (modules are read-only to generated code)")


_REFUSE: list[Callable[[str], BaseException]] = []  # the guard's `module_state` refusal, set by `Views`


def refuse_change(detail: str) -> None:
    """Refuse a change to what generated code shares (a `module_state` violation once `Views` exist)."""
    if _REFUSE:
        raise _REFUSE[0](detail)
    raise AttributeError(detail)


class Views:
    """The views of one worker: one per module, made on first import and kept (they are immutable)."""

    def __init__(
        self,
        allowed: Callable[[str], bool],
        refuse: Callable[[str], BaseException],
        overrides: dict[str, dict[str, Any]] | None = None,
    ):
        self._allowed = allowed
        self._views: dict[str, ModuleView] = {}
        self._overrides = overrides or {}  # module name -> attributes its view holds instead of the real ones
        _REFUSE[:] = [refuse]

    def of(self, module: types.ModuleType) -> ModuleView:
        """The view of `module`, with views of its allowed submodules loaded since it was made."""
        name = module.__name__
        view = self._views.get(name)
        if view is None:
            view = self._views[name] = ModuleView(name, module.__doc__)
            for key, value in list(vars(module).items()):
                if key.startswith("_") and key not in KEPT_DUNDERS:
                    continue
                if isinstance(value, types.ModuleType):
                    if not self._allowed(value.__name__):
                        continue
                    value = self.of(value)
                types.ModuleType.__setattr__(view, key, value)
            for key, value in self._overrides.get(name, {}).items():
                types.ModuleType.__setattr__(view, key, value)
        return view

    def imported(self, module: types.ModuleType, name: str, fromlist: Any = ()) -> ModuleView:
        """What `import name` (`from name import ...` with `fromlist`) gives: the view of `module`
        (the top-level package, or `name` itself with a fromlist), with views of the submodules on
        the way set on their parents' views (they may have been loaded after those views were made)."""
        names = [name.split(".")[: depth + 1] for depth in range(name.count(".") + 1)]
        names += [[*name.split("."), str(item)] for item in fromlist or ()]
        for parts in names:
            parent, child = sys.modules.get(".".join(parts[:-1])), sys.modules.get(".".join(parts))
            if parent is not None and child is not None and self._allowed(child.__name__):
                types.ModuleType.__setattr__(self.of(parent), parts[-1], self.of(child))
        return self.of(module)
