"""Python-level guard of the sandbox worker. Stdlib only.

Generated code runs only inside `Guard.untrusted(...)`: an audit hook refuses files outside the
episode, sockets, subprocesses, native loading, introspection of frames and code, and new
database connections; metadata of paths outside the episode and the standard library is blind
(`blindpaths`); restricted builtins and a guarded `__import__` enforce the import
allowlist; interval timers bound wall-clock and CPU time. Every refusal is recorded, so code
that swallows the exception is still caught after the call.
"""

from __future__ import annotations

import builtins
import ctypes
import os
import signal
import sqlite3
import sys
import sysconfig
import time
import types
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from operator import is_
from typing import Any

from worldsmith.bundle.codepolicy import ALLOWED_MODULES, APP_MODULES, FORBIDDEN_BUILTINS, RUNTIME_MODULE
from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox import blindpaths, worldclock
from worldsmith.runtime.sandbox.moduleview import Views


class SandboxViolation(BaseException):
    """Generated code tried something the sandbox forbids. BaseException: `except Exception` cannot swallow it."""

    def __init__(self, limit: str, detail: str, module: str | None = None):
        super().__init__(f"{limit}: {detail}")
        self.limit = limit
        self.detail = detail
        self.module = module  # the module of a refused import


# Audit events refused while generated code runs, by prefix.
_DENIED_EVENT_PREFIXES = (
    "os.",
    "subprocess.",
    "socket.",
    "ctypes.",
    "sys.",
    "cpython.",
    "gc.",
    "marshal.",
    "pickle.",
    "shutil.",
    "tempfile.",
    "glob.",
    "mmap.",
    "fcntl.",
    "resource.",
    "signal.",
    "syslog.",
    "urllib.",
    "http.",
    "ftplib.",
    "smtplib.",
    "imaplib.",
    "poplib.",
    "nntplib.",
    "telnetlib.",
    "webbrowser.",
    "pty.",
    "sqlite3.",
    "builtins.input",
    "builtins.breakpoint",
    "code.__new__",
    "function.__new__",
    "setopencodehook",
)
_EVENT_LIMITS = {
    "socket.": "network",
    "subprocess.": "subprocess",
    "os.system": "subprocess",
    "os.exec": "subprocess",
    "os.posix_spawn": "subprocess",
    "os.spawn": "subprocess",
    "os.fork": "process",
    "os.forkpty": "process",
    "ctypes.": "native_code",
    "sqlite3.": "database",
}
_DENIED_IMPORTS = frozenset(
    {
        "ctypes",
        "_ctypes",
        "subprocess",
        "_posixsubprocess",
        "socket",
        "_socket",
        "ssl",
        "_ssl",
        "select",
        "selectors",
        "multiprocessing",
        "_multiprocessing",
        "mmap",
        "pty",
        "fcntl",
        "resource",
        "signal",
        "_signal",
        "gc",
        "importlib",
        "_imp",
        "builtins",
        "inspect",
        "code",
        "codeop",
        "marshal",
        "pickle",
        "_pickle",
        "shutil",
        "tempfile",
        "threading",
        "_thread",
        "asyncio",
        "urllib",
        "http",
        "posix",
        "os",
        "pwd",  # the host's users (e.g. `os.path.expanduser('~root')`), read by libc without an audit event
        "grp",
    }
)
# In workers of ASGI environments the web stack runs inside the same window as the app's code and
# needs introspection, os and sys; there the hook refuses only what reaches out of the worker or
# changes files (the kernel layers stay the boundary either way).
_FRAMEWORK_DENIED_PREFIXES = (
    "socket.",
    "subprocess.",
    "os.system",
    "os.exec",
    "os.posix_spawn",
    "os.spawn",
    "os.fork",
    "os.forkpty",
    "os.kill",
    "os.killpg",
    "os.remove",
    "os.unlink",
    "os.rename",
    "os.rmdir",
    "os.mkdir",
    "os.chmod",
    "os.chown",
    "os.truncate",
    "os.link",
    "os.symlink",
    "os.putenv",
    "os.unsetenv",
    "ctypes.",
    "pty.",
    "webbrowser.",
    "urllib.Request",
    "http.client.",
    "ftplib.",
    "smtplib.",
    "imaplib.",
    "poplib.",
    "nntplib.",
    "telnetlib.",
    "shutil.",
    "sqlite3.connect",
    "sys.addaudithook",
    "sys.settrace",
    "sys.setprofile",
    "setopencodehook",
    "builtins.input",
    "builtins.breakpoint",
)
_SENSITIVE_SETATTR = frozenset(
    {
        "__code__",
        "__globals__",
        "__closure__",
        "__defaults__",
        "__kwdefaults__",
        "__builtins__",
        "__class__",
        "__bases__",
        "__dict__",
        "__getattribute__",
    }
)
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


#: Module globals the standard library rebinds itself as it runs (uuid1's node and clock): not tampering.
_STDLIB_REBOUND = frozenset({("uuid", "_node"), ("uuid", "_last_timestamp")})


#: Modules the worker's own code calls after generated code ran (paths and files: episode
#: directories, snapshot files), fingerprinted with the allowed ones: a rebinding (say
#: `pathlib.os.path.exists`) is caught before trusted code meets it.
TRUSTED_MODULES = frozenset({"os", "posixpath", "genericpath", "stat"})


#: Where CPython 3.11 keeps a dict's entry count and its version tag (PEP 509: a value no other dict
#: had, given anew by every change of the dict), read through ctypes: a table whose tag is still the
#: one recorded is unchanged, so only changed tables are compared entry by entry.
_DICT_USED_OFFSET, _DICT_VERSION_OFFSET = 16, 24


def _version_tags_work() -> bool:
    """Whether this interpreter's dicts have version tags where `_DICT_VERSION_OFFSET` says (checked on
    a probe dict: its count where expected, its tag new after each change); else tables are compared whole."""
    if sys.implementation.name != "cpython" or sys.version_info[:2] != (3, 11):
        return False
    probe: dict[str, int] = {}
    used = ctypes.c_ssize_t.from_address(id(probe) + _DICT_USED_OFFSET)
    tag = ctypes.c_uint64.from_address(id(probe) + _DICT_VERSION_OFFSET)
    seen = {tag.value}
    for change in (lambda: probe.__setitem__("a", 1), lambda: probe.__setitem__("a", 2), probe.clear):
        change()
        if tag.value in seen or used.value != len(probe):
            return False
        seen.add(tag.value)
    return True


_VERSION_TAGS = _version_tags_work()


def _version_tag(table: dict[str, Any]) -> ctypes.c_uint64 | None:
    """A live view of `table`'s version tag (the table must outlive it), or None where tags are not read."""
    return ctypes.c_uint64.from_address(id(table) + _DICT_VERSION_OFFSET) if _VERSION_TAGS else None


class ModuleState:
    """A fingerprint of the attribute tables generated code shares with every later call in its
    worker: the `__dict__` of each loaded module of `modules` (allowed modules and their submodules),
    of the sandbox's stub modules and of the restricted builtins table, plus the fields of
    `decimal`'s template contexts. `changed()` after a call names what was rebound, added or
    removed, and puts the recorded values back (the worker's own code, e.g. its reply's `json.dumps`,
    meets clean modules until it is retired). Entries are compared by identity with the recorded
    keys and values, which are kept alive. A table whose version tag (`_version_tag`) is unchanged
    is skipped: the check costs a few microseconds, not a walk over every entry of every table."""

    def __init__(self, modules: frozenset[str], extra: dict[str, dict[str, Any]]):
        self.modules = modules
        self.extra = extra
        self._tables: list[tuple[str, dict[str, Any], tuple[str, ...], tuple[Any, ...]]] = []
        self._tags: list[tuple[ctypes.c_uint64 | None, int]] = []  # per table: its live tag, the tag recorded
        self._contexts: tuple[str, ...] = ()
        self._module_count = 0
        self.record()

    def _decimal_contexts(self) -> tuple[str, ...]:
        import decimal

        return tuple(repr(c) for c in (decimal.DefaultContext, decimal.BasicContext, decimal.ExtendedContext))

    def record(self) -> None:
        """Take the current tables as the clean state."""
        tables = {}
        for name, module in list(sys.modules.items()):
            if module is not None and name.split(".")[0] in self.modules:
                tables[name] = module.__dict__
        tables.update(self.extra)  # the stub `sqlite3` generated code imports, not the real one
        self._tables = [(name, table, tuple(table), tuple(table.values())) for name, table in sorted(tables.items())]
        self._tags = [self._tag(table) for _, table, _, _ in self._tables]
        self._contexts = self._decimal_contexts()
        self._module_count = len(sys.modules)

    @staticmethod
    def _tag(table: dict[str, Any]) -> tuple[ctypes.c_uint64 | None, int]:
        tag = _version_tag(table)
        return tag, tag.value if tag is not None else 0

    def changed(self) -> list[str]:
        """What was rebound since the clean state (`json.dumps`, `builtins.len`...), restored; [] if nothing."""
        tags = self._tags
        if _VERSION_TAGS and [tag.value for tag, _ in tags] == [then for _, then in tags]:
            changed: list[str] = []  # no table changed (the common case), told without a walk over any table
        else:
            changed = self._changed_tables()
        contexts = self._decimal_contexts()
        if contexts != self._contexts:  # reported, not restored: the worker runs no decimal code of its own
            labels = ("DefaultContext", "BasicContext", "ExtendedContext")
            changed += [f"decimal.{label}" for label, now, then in zip(labels, contexts, self._contexts) if now != then]
        if not changed and len(sys.modules) != self._module_count:
            self.record()  # allowed modules imported during the call: clean, watched from now on
        return changed

    def _changed_tables(self) -> list[str]:
        """The entries of tables that differ from the clean state, restored (see `changed`)."""
        changed: list[str] = []
        for index, (name, table, keys, values) in enumerate(self._tables):
            tag, recorded_tag = self._tags[index]
            if tag is not None and tag.value == recorded_tag:  # not changed since recorded (nor restored)
                continue
            # identity only (`operator.is_`, in C): no `__eq__` of generated code runs here, and not
            # `id()`, whose audit event would call the guard's hook for every entry
            if len(table) == len(keys) and all(map(is_, table, keys)) and all(map(is_, table.values(), values)):
                self._tags[index] = self._tag(table)  # changed and changed back: the same entries
                continue
            recorded = dict(zip(keys, values, strict=True))
            names = [k for k in keys if k not in table or table[k] is not recorded[k]]
            names += [k for k in table if k not in recorded]
            tampered = [
                k
                for k in names
                if (name, k) not in _STDLIB_REBOUND
                # a submodule of `name` imported during the call becomes its attribute
                and not (k not in recorded and table.get(k) is not None and sys.modules.get(f"{name}.{k}") is table[k])
            ]
            if tampered:
                changed += [f"{name}.{k}" for k in tampered]
                table.clear()
                table.update(recorded)
            else:  # only the standard library's own rebinding: the new values are the clean state
                self._tables[index] = (name, table, tuple(table), tuple(table.values()))
            self._tags[index] = self._tag(table)
        return changed


def _limit_for(event: str) -> str:
    for prefix, limit in _EVENT_LIMITS.items():
        if event.startswith(prefix):
            return limit
    return "forbidden_operation"


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


def _exact_path(path: Any) -> str | bytes:
    """`os.fspath(path)` as an exact `str` or `bytes`: a copy of a subclass's data, so that nothing
    generated code overrides (`startswith`, slicing, `__fspath__`) runs again on it."""
    value = os.fspath(path)
    return "".join([value]) if isinstance(value, str) else b"".join([value])


def _stub_module(name: str, values: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(values)
    return module


class Guard:
    """The worker's single guard: install once, then run generated code inside `untrusted()`."""

    def __init__(self, frameworks: bool = False) -> None:
        self.active = False
        self.frameworks = frameworks
        self.episode_dir: str | None = None
        self.violations: list[SandboxViolation] = []
        paths = ["stdlib", "platstdlib"] + (["purelib", "platlib"] if frameworks else [])
        self.read_roots = tuple(sorted({os.path.realpath(p) for p in (sysconfig.get_path(n) for n in paths) if p}))
        self._trusted = False  # set while the guard itself does what it refuses to generated code
        self._stubs = {
            RUNTIME_MODULE: _stub_module(RUNTIME_MODULE, {"ToolError": ToolError, "now": worldclock.now}),
            "sqlite3": _stub_module(
                "sqlite3",
                {n: getattr(sqlite3, n) for n in _SQLITE_EXPORTS}
                | {"connect": self._connect}
                | {c.__name__: _stand_in(c, self._refuse_database) for c in (sqlite3.Connection, sqlite3.Cursor)},
            ),
        }
        if frameworks:  # an app's `os`: path helpers and an empty environment that reports secret lookups
            from worldsmith.runtime.sandbox.asgi import MonitoredEnviron

            environ = MonitoredEnviron(self._refuse_secret)
            self._stubs["os"] = _stub_module(
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
        self.allowed_modules = APP_MODULES if frameworks else ALLOWED_MODULES
        # stdlib workers hand generated code read-only views of modules (`moduleview`), whose `datetime`
        # and `time` read the world's clock (`worldclock`); the web stack of ASGI workers needs the
        # real ones (strict isolation contains those apps; their clock reads are rewritten instead)
        self.views = (
            None
            if frameworks
            else Views(
                lambda module: module.split(".")[0] in self.allowed_modules,
                lambda detail: self.refuse("module_state", detail),
                worldclock.VIEW_OVERRIDES,
            )
        )
        self.builtins = self._restricted_builtins()
        # what every call of generated code shares, recorded clean (made after the allowed modules
        # are imported, before any generated code runs) and checked after each call
        shared = {name: stub.__dict__ for name, stub in self._stubs.items()} | {"builtins": self.builtins}
        self.state = ModuleState(ALLOWED_MODULES | TRUSTED_MODULES, shared)
        self._wall_s = self._cpu_s = 0.0
        self._deadline = 0.0

    def _refuse_database(self, detail: str) -> SandboxViolation:
        return self.refuse("database", detail)

    def _refuse_secret(self, name: str) -> None:
        raise self.refuse("secrets", f"read of environment variable {name!r} refused (workers get no secrets)")

    def _connect(self, database: Any, *args: Any, uri: bool = False, **kwargs: Any) -> sqlite3.Connection:
        """sqlite3.connect for generated code: a database file in the episode's directory (the
        snapshots verifiers read), opened read-only; anything else is refused."""
        name = os.fsdecode(database) if isinstance(database, (str, bytes, os.PathLike)) else ""
        path = name
        if uri and name.startswith("file:"):
            path = urllib.parse.unquote(urllib.parse.urlsplit(name).path)
        real = self._real_path(path) if path and path != ":memory:" else None
        with self._trust():
            opens = real is not None and self._in_episode(real, itself=False) and os.path.isfile(real)
            if opens:
                return sqlite3.connect(f"file:{urllib.parse.quote(real)}?mode=ro", uri=True)
        raise self.refuse(
            "database",
            f"sqlite3.connect{self._describe((database, *args))} refused: only the episode's "
            "snapshot files can be opened (read-only)",
        )

    # -- paths ---------------------------------------------------------------------------
    @contextmanager
    def _trust(self) -> Iterator[None]:
        """The guard's own work: the audit hook and the path gate step aside (no generated code runs)."""
        trusted, self._trusted = self._trusted, True
        try:
            yield
        finally:
            self._trusted = trusted

    def _descriptor_path(self, fd: Any) -> str | None:
        """The file an open descriptor of this process is open on, or None (a pipe, a socket, not open)."""
        with self._trust():
            try:
                target = os.readlink(f"/proc/self/fd/{int.__index__(fd)}")
            except (OSError, TypeError, ValueError, OverflowError):
                return None
        return target if target.startswith(os.sep) else None

    def _real_path(self, path: Any, dir_fd: Any = None) -> str | None:
        """`path` (str, bytes or path-like; relative to `dir_fd` when given) with every symlink
        resolved, or None where it names nothing resolvable. Generated code's objects are turned
        into exact strings first: none of their methods runs while the guard trusts itself."""
        name = os.fsdecode(_exact_path(path))
        if dir_fd is not None and not name.startswith(os.sep):
            base = self._descriptor_path(dir_fd)
            if base is None:
                return None
            name = os.path.join(base, name)
        with self._trust():
            return os.path.realpath(name)

    def _in_episode(self, real: str, *, itself: bool = True) -> bool:
        """Whether resolved path `real` lies in the episode's directory (or, with `itself`, is it)."""
        episode = self.episode_dir
        return bool(episode) and ((itself and real == episode) or real.startswith(episode + os.sep))

    def _in_read_roots(self, real: str, *, itself: bool = True) -> bool:
        """Whether resolved path `real` lies in a readable root (the stdlib...) (or, with `itself`, is one)."""
        return any((itself and real == root) or real.startswith(root + os.sep) for root in self.read_roots)

    def visible(self, target: Any, dir_fd: Any) -> Any:
        """The gate of `blindpaths`: while generated code runs, `target` as the real function is to
        get it (an exact str or bytes; an exact int for a descriptor) if it lies in the episode's
        directory or the standard library (the readable roots), else None: everything else on the
        host looks absent. A descriptor is hidden when it is open on such a file; one open on no
        path (a pipe, a socket, an event fd) says nothing about the host and passes. Outside
        generated code, `target` unchanged."""
        if not self.active or self._trusted:
            return target
        if isinstance(target, int):
            passed: Any = int.__index__(target)
            real = self._descriptor_path(passed)
            if real is None:
                return passed
        else:
            passed = _exact_path(target)
            real = self._real_path(passed, dir_fd)
            if real is None:
                return None
        return passed if self._in_episode(real) or self._in_read_roots(real) else None

    # -- refusal bookkeeping -------------------------------------------------------------
    def refuse(self, limit: str, detail: str, module: str | None = None) -> SandboxViolation:
        violation = SandboxViolation(limit, detail, module)
        self.violations.append(violation)
        return violation

    # -- audit hook ----------------------------------------------------------------------
    def install(self) -> None:
        """Install the audit hook, the path gate and the timer signal handlers (once per process)."""
        sys.addaudithook(self._audit)
        blindpaths.blind(os, self.visible)
        signal.signal(signal.SIGALRM, self._on_alarm)
        signal.signal(signal.SIGPROF, self._on_cpu)
        self.state.record()  # the path gate replaced functions of `os`: that is the clean state

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active or self._trusted:
            return
        if self.frameworks:
            if event == "open":
                self._check_open(args)
            elif event.startswith(_FRAMEWORK_DENIED_PREFIXES):
                raise self.refuse(_limit_for(event), f"{event}{self._describe(args)} refused")
            return
        if event == "open":
            self._check_open(args)
        elif event == "import":
            top = str(args[0]).split(".")[0]
            if top in _DENIED_IMPORTS:
                raise self.refuse("import", f"import of {args[0]!r} refused", str(args[0]))
        elif event == "object.__getattr__":
            raise self.refuse("introspection", f"access to {args[1]!r} refused")
        elif event in ("object.__setattr__", "object.__delattr__"):
            if str(args[1]) in _SENSITIVE_SETATTR:
                raise self.refuse("introspection", f"changing {args[1]!r} refused")
        elif event == "sys._getframe":
            return  # used internally by namedtuple/enum; generated code cannot import sys itself
        elif event.startswith(_DENIED_EVENT_PREFIXES):
            raise self.refuse(_limit_for(event), f"{event}{self._describe(args)} refused")

    @staticmethod
    def _describe(args: tuple[Any, ...]) -> str:
        try:
            text = repr(args)
        except Exception:  # noqa: BLE001 - hostile reprs
            text = "(...)"
        return text if len(text) < 200 else text[:197] + "..."

    def _check_open(self, args: tuple[Any, ...]) -> None:
        path, mode, flags = (list(args) + [None, None, None])[:3]
        if isinstance(path, int):
            raise self.refuse("filesystem", f"open of file descriptor {path} refused")
        try:
            real = self._real_path(path)
        except Exception:  # noqa: BLE001
            raise self.refuse("filesystem", f"open of {path!r} refused") from None
        if real is not None and self._in_episode(real):
            return
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        )
        if not writing and real is not None and self._in_read_roots(real, itself=False):
            return  # the standard library, for lazy imports of allowed modules
        raise self.refuse(
            "filesystem", f"open({os.fsdecode(path)!r}, {'write' if writing else 'read'}) outside the episode refused"
        )

    # -- restricted builtins -------------------------------------------------------------
    def _restricted_builtins(self) -> dict[str, Any]:
        allowed = {name: value for name, value in vars(builtins).items() if name not in FORBIDDEN_BUILTINS}
        guard = self

        def guarded_import(
            name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
        ) -> Any:
            if level:
                raise guard.refuse("import", "relative imports refused")
            if name in guard._stubs:
                return guard._stubs[name]
            if not fromlist and name.split(".")[0] in guard._stubs:  # `import os.path` binds the stand-in `os`
                return guard._stubs[name.split(".")[0]]
            if name == "worldsmith" and fromlist:
                raise guard.refuse("import", f"import from {name!r} refused", name)
            if name != RUNTIME_MODULE and name.split(".")[0] not in guard.allowed_modules:
                raise guard.refuse("import", f"import of {name!r} refused (not on the allowlist)", name)
            module = builtins.__import__(name, globals, locals, fromlist, level)
            if guard.views is None or name == RUNTIME_MODULE:
                return module
            return guard.views.imported(module, name, fromlist)

        def safe_getattr(obj: Any, name: str, *default: Any) -> Any:
            if isinstance(name, str) and name.startswith("_"):
                raise guard.refuse("introspection", f"getattr of private attribute {name!r} refused")
            return getattr(obj, name, *default)

        def safe_hasattr(obj: Any, name: str) -> bool:
            return hasattr(obj, name) if not (isinstance(name, str) and name.startswith("_")) else False

        def safe_setattr(obj: Any, name: str, value: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise guard.refuse("introspection", f"setattr of private attribute {name!r} refused")
            setattr(obj, name, value)

        def episode_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            guard._check_open((file, mode, 0))  # refuses anything outside the episode's directory
            return builtins.open(file, mode, *args, **kwargs)

        def refusing(name: str) -> Any:
            def refuse(*args: Any, **kwargs: Any) -> Any:
                raise guard.refuse("forbidden_builtin", f"{name}() is not available to generated code")

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

    def namespace(self, name: str) -> dict[str, Any]:
        """A fresh module namespace for generated code."""
        return {"__name__": name, "__builtins__": self.builtins, "ToolError": ToolError}

    # -- running untrusted code ----------------------------------------------------------
    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.active:
            raise self.refuse("timeout", f"call exceeded {self._wall_s:g} s of wall-clock time")

    def _on_cpu(self, signum: int, frame: Any) -> None:
        if self.active:
            raise self.refuse("cpu", f"call exceeded {self._cpu_s:g} CPU seconds")

    def _on_progress(self) -> int:
        """SQLite progress handler of episode connections: interrupt queries past the deadline."""
        if self.active and time.monotonic() > self._deadline:
            self.refuse("timeout", f"SQL query exceeded {self._wall_s:g} s of wall-clock time")
            return 1
        return 0

    def watch(self, conn: sqlite3.Connection) -> None:
        """Let the deadline of untrusted calls interrupt `conn`'s queries."""
        sqlite3.Connection.set_progress_handler(conn, self._on_progress, 10_000)

    @contextmanager
    def untrusted(self, *, episode_dir: str | None, wall_s: float, cpu_s: float) -> Iterator[None]:
        """Run generated code: audit refusals on, wall-clock and CPU timers armed, watched SQLite
        queries interrupted past the deadline. Violations recorded meanwhile stay in `self.violations`."""
        self._wall_s, self._cpu_s = wall_s, cpu_s
        self._deadline = time.monotonic() + wall_s
        self.episode_dir = episode_dir
        signal.setitimer(signal.ITIMER_REAL, wall_s)
        signal.setitimer(signal.ITIMER_PROF, cpu_s)
        self.active = True
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.setitimer(signal.ITIMER_PROF, 0)
            self.active = False
            self.episode_dir = None
