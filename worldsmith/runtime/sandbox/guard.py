"""Python-level guard of the sandbox worker. Stdlib only.

Generated code runs only inside `Guard.untrusted(...)`: an audit hook refuses files outside the
episode, sockets, subprocesses, native loading, introspection of frames and code, and new
database connections (which events and imports: `auditpolicy`); metadata of paths outside the
episode and the standard library is blind (`blindpaths`, gated by `Guard.visible`); restricted
builtins and a guarded `__import__` enforce the import allowlist (`namespace`); interval timers
bound wall-clock and CPU time. Every refusal is recorded, so code that swallows the exception is
still caught after the call; what the code changed in shared module state is caught by
`Guard.state` (`modulestate`).

A worker process has one guard, `GUARD`, built by `worker.main` after the allowed modules are
loaded and installed before its first request; the worker's code reads it from here.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
import sysconfig
import time
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from worldsmith.bundle.codepolicy import ALLOWED_MODULES, APP_MODULES
from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox import auditpolicy, blindpaths, worldclock
from worldsmith.runtime.sandbox.modulestate import TRUSTED_MODULES, ModuleState
from worldsmith.runtime.sandbox.moduleview import Views
from worldsmith.runtime.sandbox.namespace import restricted_builtins, stub_modules


class SandboxViolation(BaseException):
    """Generated code tried something the sandbox forbids. BaseException: `except Exception` cannot swallow it."""

    def __init__(self, limit: str, detail: str, module: str | None = None):
        super().__init__(f"{limit}: {detail}")
        self.limit = limit
        self.detail = detail
        self.module = module  # the module of a refused import


def _exact_path(path: Any) -> str | bytes:
    """`os.fspath(path)` as an exact `str` or `bytes`: a copy of a subclass's data, so that nothing
    generated code overrides (`startswith`, slicing, `__fspath__`) runs again on it."""
    value = os.fspath(path)
    return "".join([value]) if isinstance(value, str) else b"".join([value])


class Guard:
    """The worker's single guard: install once, then run generated code inside `untrusted()`."""

    def __init__(self, frameworks: bool = False, call_files: int = 64) -> None:
        self.active = False
        self.frameworks = frameworks
        self.episode_dir: str | None = None
        # files a run of generated code may open for writing in its episode's directory, and how many it has
        self.call_files = call_files
        self._written = 0
        self.violations: list[SandboxViolation] = []
        paths = ["stdlib", "platstdlib"] + (["purelib", "platlib"] if frameworks else [])
        self.read_roots = tuple(sorted({os.path.realpath(p) for p in (sysconfig.get_path(n) for n in paths) if p}))
        self._trusted = False  # set while the guard itself does what it refuses to generated code
        self._stubs = stub_modules(
            connect=self._connect,
            refuse_database=self._refuse_database,
            refuse_secret=self._refuse_secret,
            frameworks=frameworks,
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
        self.builtins = restricted_builtins(
            refusal=self.refuse,
            stubs=self._stubs,
            allowed_modules=self.allowed_modules,
            views=self.views,
            check_open=self._check_open,
        )
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
            if real is not None and self._in_episode(real, itself=False) and os.path.isfile(real):
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
        if not episode:
            return False
        return (itself and real == episode) or real.startswith(episode + os.sep)

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
            elif event.startswith(auditpolicy.FRAMEWORK_DENIED_PREFIXES):
                raise self.refuse(auditpolicy.limit_for(event), f"{event}{self._describe(args)} refused")
            return
        if event == "open":
            self._check_open(args)
        elif event == "import":
            top = str(args[0]).split(".")[0]
            if top in auditpolicy.DENIED_IMPORTS:
                raise self.refuse("import", f"import of {args[0]!r} refused", str(args[0]))
        elif event == "object.__getattr__":
            raise self.refuse("introspection", f"access to {args[1]!r} refused")
        elif event in ("object.__setattr__", "object.__delattr__"):
            if str(args[1]) in auditpolicy.SENSITIVE_SETATTR:
                raise self.refuse("introspection", f"changing {args[1]!r} refused")
        elif event == "sys._getframe":
            return  # used internally by namedtuple/enum; generated code cannot import sys itself
        elif event.startswith(auditpolicy.DENIED_EVENT_PREFIXES):
            raise self.refuse(auditpolicy.limit_for(event), f"{event}{self._describe(args)} refused")

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
        writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        )
        if real is not None and self._in_episode(real):
            self._written += 1 if writing else 0
            if self._written > self.call_files:
                raise self.refuse(
                    "call_files",
                    f"a call may open at most {self.call_files} files for writing in its episode's directory "
                    "(WORLDSMITH_SANDBOX_CALL_FILES)",
                )
            return
        if not writing and real is not None and self._in_read_roots(real, itself=False):
            return  # the standard library, for lazy imports of allowed modules
        raise self.refuse(
            "filesystem", f"open({os.fsdecode(path)!r}, {'write' if writing else 'read'}) outside the episode refused"
        )

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
        self._written = 0
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


#: The guard of this worker process: built by `worker.main` before it confines itself, installed before
#: the first request, and read (as `guard.GUARD`, when it is needed) by the code that runs generated
#: code and by the episode connections' transaction gate.
GUARD: Guard
