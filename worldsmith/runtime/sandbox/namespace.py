"""What generated code's names resolve to: the restricted builtins and the stub modules. Stdlib only.

The guard (`guard.Guard`) builds both once, before any generated code runs, and hands every module
of generated code a namespace whose `__builtins__` is `restricted_builtins(...)`: the builtins less
`FORBIDDEN_BUILTINS` (each a function that refuses), a guarded `__import__` that enforces the import
allowlist and answers stub modules and read-only module views, attribute access without private
names, and an `open` limited to the episode's directory. `stub_modules` are what generated code's
`import worldsmith.runtime`, `import sqlite3` (and, in ASGI workers, `import os`) get instead of the
real modules. Every refusal goes through the guard's `refuse`, so it is recorded.
"""

from __future__ import annotations

import builtins
import os
import sqlite3
import types
from collections.abc import Callable
from typing import Any

from worldsmith.bundle.codepolicy import FORBIDDEN_BUILTINS, RUNTIME_MODULE
from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox import worldclock
from worldsmith.runtime.sandbox.moduleview import Views

#: Records a violation (limit, detail) and returns it, for the caller to raise: `guard.Guard.refuse`.
Refusal = Callable[..., BaseException]  # (limit, detail[, refused module]) -> the recorded violation

_SQLITE_EXPORTS = (
    "Row",
    "Error",
    "DatabaseError",
    "IntegrityError",
    "OperationalError",
    "ProgrammingError",
    "InterfaceError",
    "DataError",
    "NotSupportedError",
    "Warning",
    "complete_statement",
    "sqlite_version",
    "sqlite_version_info",
    "PARSE_DECLTYPES",
    "PARSE_COLNAMES",
)


def _stand_in(real: type, refuse: Callable[[str], BaseException]) -> type:
    """A class named like `real` (sqlite3.Connection, sqlite3.Cursor) for generated code: annotations,
    `isinstance` and `issubclass` answer as for `real`, but making one (which would open a database or
    reach the real class) is refused. The real class stays out of reach: it lives only in this closure."""

    class StandInType(type):
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, real)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return isinstance(subclass, type) and issubclass(subclass, real)

        def __call__(cls, *args: Any, **kwargs: Any) -> Any:
            raise refuse(f"sqlite3.{real.__name__}(...) refused: tools get the episode's connection as an argument")

    namespace = {"__module__": "sqlite3", "__qualname__": real.__name__, "__doc__": real.__doc__}
    return StandInType(real.__name__, (), namespace)


def _stub_module(name: str, values: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(values)
    return module


def stub_modules(
    *,
    connect: Callable[..., sqlite3.Connection],
    refuse_database: Callable[[str], BaseException],
    refuse_secret: Callable[[str], None],
    frameworks: bool,
) -> dict[str, types.ModuleType]:
    """The modules generated code's imports of these names get, by name: the runtime's (`ToolError`,
    the world's `now`); `sqlite3` with its types and constants, `connect` as the guard gates it and
    stand-ins for its classes; in ASGI workers (`frameworks`) an `os` of path helpers and an empty
    environment that reports secret lookups (`refuse_secret`)."""
    stubs = {
        RUNTIME_MODULE: _stub_module(RUNTIME_MODULE, {"ToolError": ToolError, "now": worldclock.now}),
        "sqlite3": _stub_module(
            "sqlite3",
            {n: getattr(sqlite3, n) for n in _SQLITE_EXPORTS}
            | {"connect": connect}
            | {c.__name__: _stand_in(c, refuse_database) for c in (sqlite3.Connection, sqlite3.Cursor)},
        ),
    }
    if frameworks:  # an app's `os`: path helpers and an empty environment that reports secret lookups
        from worldsmith.runtime.sandbox.asgi import MonitoredEnviron

        environ = MonitoredEnviron(refuse_secret)
        stubs["os"] = _stub_module(
            "os",
            {
                "environ": environ,
                "getenv": environ.get,
                "path": os.path,
                "sep": os.sep,
                "linesep": os.linesep,
                "PathLike": os.PathLike,
                "fspath": os.fspath,
            },
        )
    return stubs


def restricted_builtins(
    *,
    refusal: Refusal,
    stubs: dict[str, types.ModuleType],
    allowed_modules: frozenset[str],
    views: Views | None,
    check_open: Callable[[tuple[Any, ...]], None],
) -> dict[str, Any]:
    """The builtins table of generated code: imports answered from `stubs`, else allowed if their top
    module is in `allowed_modules` (or is the runtime's) and handed out through `views` (None: the
    real modules); private attribute names refused to getattr/setattr; `open` gated by `check_open`
    (the guard's file policy); every forbidden builtin (and `super`) a function that refuses."""
    allowed = {name: value for name, value in vars(builtins).items() if name not in FORBIDDEN_BUILTINS}

    def guarded_import(name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0) -> Any:
        if level:
            raise refusal("import", "relative imports refused")
        if name in stubs:
            return stubs[name]
        if not fromlist and name.split(".")[0] in stubs:  # `import os.path` binds the stand-in `os`
            return stubs[name.split(".")[0]]
        if name == "worldsmith" and fromlist:
            raise refusal("import", f"import from {name!r} refused", name)
        if name != RUNTIME_MODULE and name.split(".")[0] not in allowed_modules:
            raise refusal("import", f"import of {name!r} refused (not on the allowlist)", name)
        module = builtins.__import__(name, globals, locals, fromlist, level)
        if views is None or name == RUNTIME_MODULE:
            return module
        return views.imported(module, name, fromlist)

    def safe_getattr(obj: Any, name: str, *default: Any) -> Any:
        if isinstance(name, str) and name.startswith("_"):
            raise refusal("introspection", f"getattr of private attribute {name!r} refused")
        return getattr(obj, name, *default)

    def safe_hasattr(obj: Any, name: str) -> bool:
        return hasattr(obj, name) if not (isinstance(name, str) and name.startswith("_")) else False

    def safe_setattr(obj: Any, name: str, value: Any) -> None:
        if isinstance(name, str) and name.startswith("_"):
            raise refusal("introspection", f"setattr of private attribute {name!r} refused")
        setattr(obj, name, value)

    def episode_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        check_open((file, mode, 0))  # refuses anything outside the episode's directory
        return builtins.open(file, mode, *args, **kwargs)

    def refusing(name: str) -> Any:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise refusal("forbidden_builtin", f"{name}() is not available to generated code")

        return refuse

    allowed.update({name: refusing(name) for name in FORBIDDEN_BUILTINS | {"super"}})
    allowed.update(
        __import__=guarded_import,
        getattr=safe_getattr,
        hasattr=safe_hasattr,
        setattr=safe_setattr,
        open=episode_open,
    )
    return allowed
