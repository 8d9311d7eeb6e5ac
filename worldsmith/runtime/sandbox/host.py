"""The worker's `Host` (bundle/kinds.py): how the environments' kinds run generated code. Stdlib only.

`SandboxHost.run` is the one way generated code runs in a worker: inside the guard's window
(`guard.GUARD.untrusted`), with `random` and `decimal` fresh (`fresh_state`), its stdout captured,
and its outcome checked after: an exception it raised becomes a `Failure` (tool_error or env_error,
with where in its files it was raised), a refusal recorded meanwhile or a change of shared module
state a Failure naming the sandbox limit (and the worker is retired). On top of `run`: a module of
generated code (`module`), an ASGI environment's app started and called (`start_app`,
`call_route`), and the databases verifiers read (`databases`, `database_files`).
"""

from __future__ import annotations

import _random
import contextlib
import decimal
import functools
import gc
import io
import math
import os
import random
import sqlite3
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import CodeType
from typing import TYPE_CHECKING, Any, Literal

from worldsmith.bundle.asgiapp import CLOCK, ENGINE_FACTORY
from worldsmith.bundle.sqlscript import deserialize, snapshot
from worldsmith.jsonvalue import JsonObject, JsonValue
from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox import guard, worldclock
from worldsmith.runtime.sandbox.episodedb import (
    APP_SAVEPOINT,
    SAVEPOINT,
    AppConnection,
    create_at,
    open_directory,
    refuse_transaction_control,
    remove_side_files_at,
)
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.guard import SandboxViolation
from worldsmith.runtime.sandbox.messages import Status, WorkerConfig
from worldsmith.runtime.sandbox.protocol import truncated
from worldsmith.runtime.sandbox.records import LoadedEnv, OpenEpisode

if TYPE_CHECKING:  # loaded late, by ASGI workers only (worker._preload)
    from worldsmith.runtime.sandbox.asgi import Route

MAX_STDOUT = 64 * 1024

# What every run of generated code starts from (taken before any runs; C-level callables, which
# generated code cannot rebind): `random`'s shared generator reseeded, a fresh decimal context.
_RANDOM = random._inst
_RANDOM_SEED = _random.Random.seed
_DECIMAL_CONTEXT = decimal.Context()
_SET_DECIMAL_CONTEXT = decimal.setcontext


def fresh_state(seed: int) -> None:
    """`random` and `decimal` as no earlier call left them: the shared generator reseeded with
    `seed` (the parent's, per call and recorded for replay; 0 outside calls), a fresh context."""
    _RANDOM_SEED(_RANDOM, seed)
    _RANDOM.gauss_next = None  # type: ignore[attr-defined]  # set by Random.seed; typeshed does not declare it
    _SET_DECIMAL_CONTEXT(_DECIMAL_CONTEXT.copy())


# read through the descriptor: no attribute hook of the code runs
_TRACEBACK: types.GetSetDescriptorType = vars(BaseException)["__traceback__"]


def _text(make: Callable[[BaseException], str], exc: BaseException) -> str:
    """The text `make` gives for an exception of generated code, as an exact str (no method of a str
    subclass runs on it later); a mark if making it fails. Called while the guard is on: `make`
    formats objects of generated code."""
    try:
        return str.__add__("", make(exc))
    except BaseException as problem:  # noqa: BLE001 - a violation meanwhile is recorded by the guard
        return f"<unprintable: {type(problem).__name__}>"


def _refusal_text(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__


def _fault_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _code_location(trace: types.TracebackType | None, files: tuple[str, ...]) -> str:
    """Where in `files` the innermost frame of `trace` ran, read from frames and code objects only
    (no source lookup: generated code's `__loader__` never runs)."""
    last = None
    for frame, line in traceback.walk_tb(trace):
        if frame.f_code.co_filename in files:
            last = (frame.f_code.co_filename, line, frame.f_code.co_name)
    return f" (at {last[0]}:{last[1]} in {last[2]})" if last else ""


def app_module_name(key: str) -> str:
    """The sys.modules name of an ASGI environment's app (one per runtime key)."""
    return "worldsmith_app_" + "".join(c if c.isalnum() else "_" for c in key)


class SandboxHost:
    """Runs generated code for the environments' kinds (their `Host`), one request at a time."""

    def __init__(self, config: WorkerConfig):
        self.config = config  # its limits: call_timeout_s (wall clock) and cpu_s, per run
        self.seed = 0  # `random`'s seed for the generated code of the request at hand
        # ASGI environments: the connection their engines hand out right now
        self.current_conn: sqlite3.Connection | None = None

    def run(
        self, fn: Callable[[], Any], *, episode: OpenEpisode | None, files: tuple[str, ...], wall_s: float | None = None
    ) -> tuple[Any, str]:
        """Run `fn` as generated code (within `wall_s` seconds, at most the call timeout); returns
        (result, captured stdout) or raises Failure."""
        stdout, stderr = sys.stdout, sys.stderr
        capture = io.StringIO()
        sys.stdout = sys.stderr = capture
        before = len(guard.GUARD.violations)
        fresh_state(self.seed)
        result: Any = None
        # an exception the code raised: its kind, its text (made while the guard is on: its class is
        # generated code) and its traceback (read after, by the worker, from frames alone)
        outcome: tuple[Status | Literal["recursion"], str, Any] | None = None
        try:
            with guard.GUARD.untrusted(
                episode_dir=episode.directory if episode else None,
                wall_s=min(self.config["call_timeout_s"], wall_s if wall_s is not None else math.inf),
                cpu_s=self.config["cpu_s"],
            ):
                try:
                    result = fn()
                except (SandboxViolation, MemoryError):
                    raise
                except RecursionError as exc:
                    outcome = "recursion", "maximum recursion depth exceeded", _TRACEBACK.__get__(exc)
                except ToolError as exc:
                    outcome = "tool_error", _text(_refusal_text, exc), None
                except BaseException as exc:  # noqa: BLE001 - any exception of generated code is an env fault
                    outcome = "env_error", _text(_fault_text, exc), _TRACEBACK.__get__(exc)
        except SandboxViolation:
            pass
        except MemoryError:
            guard.GUARD.refuse("memory", "call exceeded the worker's memory limit")
        finally:
            sys.stdout, sys.stderr = stdout, stderr
        if outcome is not None:
            kind, text, trace = outcome
            text += _code_location(trace, files)
            if kind == "recursion":
                guard.GUARD.refuse("recursion", text)
            elif len(guard.GUARD.violations) == before:
                raise Failure(kind, text)
        # restores what it names; the worker (strict: the episode's process) is retired for it
        tampered = guard.GUARD.state.changed()
        if tampered:
            guard.GUARD.refuse("module_state", f"modified module state: {', '.join(tampered[:10])}")
        if len(guard.GUARD.violations) > before:
            violation = guard.GUARD.violations[before]
            text = f"sandbox limit {violation.limit}: {violation.detail}"
            raise Failure("env_error", text, violation.limit, violation.module)
        return result, truncated(capture.getvalue(), MAX_STDOUT)

    def module(self, code: CodeType, name: str, episode: OpenEpisode | None) -> dict[str, Any]:
        """The namespace left by running `code` as module `name` of generated code."""
        namespace = guard.GUARD.namespace(name)
        self.run(lambda: exec(code, namespace), episode=episode, files=(code.co_filename,))
        return namespace

    # -- ASGI environments -------------------------------------------------------------------
    def _engine(self, *args: Any, **kwargs: Any) -> Any:
        """What the app's `create_engine(...)` returns: an engine whose connections are the
        episode's own database connection, whatever URL the app asked for."""
        from sqlalchemy import create_engine
        from sqlalchemy.pool import NullPool

        def connection() -> sqlite3.Connection:
            if self.current_conn is None:
                raise RuntimeError("no episode database is open")
            return self.current_conn

        # no reset on return: the runtime, not the pool, ends the call's savepoint
        return create_engine("sqlite://", creator=connection, poolclass=NullPool, pool_reset_on_return=None)

    def start_app(self, env: LoadedEnv) -> dict[str, Route]:
        """Run app.py once (on a private copy of the world), read its routes (by tool name) and build
        what its first request would (`asgi.warm`)."""
        if env.app is not None:
            return env.routes
        from worldsmith.runtime.sandbox import asgi

        # a registered module: pydantic and SQLAlchemy resolve a class's annotations through sys.modules
        module = types.ModuleType(app_module_name(env.key))
        namespace = module.__dict__
        namespace.update(guard.GUARD.namespace(module.__name__))
        namespace[ENGINE_FACTORY] = self._engine
        namespace[CLOCK] = worldclock.app_clock
        sys.modules[module.__name__] = module
        with self._private_world(env):
            self.run(lambda: exec(env.code, namespace), episode=None, files=("app.py",))
            from fastapi import FastAPI

            apps = sorted(
                (v for v in namespace.values() if isinstance(v, FastAPI)), key=lambda v: v is not namespace.get("app")
            )
            if not apps:
                raise Failure("env_error", "app.py defines no FastAPI application")
            routes, _ = self.run(lambda: asgi.routes_of(apps[0]), episode=None, files=("app.py",))
            self.run(lambda: asgi.warm(apps[0], namespace), episode=None, files=("app.py",))
        env.app, env.routes = apps[0], routes
        return env.routes

    @contextmanager
    def _private_world(self, env: LoadedEnv) -> Iterator[sqlite3.Connection]:
        """A private in-memory copy of `env`'s world, bound as the connection the app's code gets, and
        closed (unbound) on exit."""
        scratch = deserialize(env.world, factory=AppConnection, transactions=refuse_transaction_control)
        worldclock.bind_sql(scratch, env.clock)
        guard.GUARD.watch(scratch)  # a query of the app's is interrupted past the run's deadline
        for name in (SAVEPOINT, APP_SAVEPOINT):  # what the app's commits and rollbacks work within
            sqlite3.Connection.execute(scratch, f"SAVEPOINT {name}")
        self.current_conn = scratch
        try:
            yield scratch
        finally:
            self.current_conn = None
            sqlite3.Connection.close(scratch)

    def warm_app(self, env: LoadedEnv) -> None:
        """In a spare, confined and before any episode claims it: run the built app's warm-up again
        (`asgi.warm`: no endpoint runs) on a private copy of the world, so that the pages its first
        request touches are this process's own before a call waits for them. Failures are ignored:
        the episode's first call meets them as it would have."""
        module = sys.modules.get(app_module_name(env.key))
        if env.app is None or module is None:
            return
        from worldsmith.runtime.sandbox import asgi  # loaded in ASGI workers (worker._preload)

        with self._private_world(env), contextlib.suppress(Exception):  # the first call pays what this would have
            self.run(lambda: asgi.warm(env.app, module.__dict__), episode=None, files=("app.py",))

    def stand_in_reads(self, env: LoadedEnv, names: list[str], seconds: float) -> bool:
        """One request to each of the app's routes `names` as generated code, on a private copy of the
        world, with stand-in arguments (1 for each path parameter, nothing else), within `seconds` in
        all: whether all were made in time, none refused by the guard (the first refusal ends them; it
        is recorded as for any run), and nothing but this process's own references holds the private
        copy after them (a session of the app's left bound to it). Their answers and failures are
        dropped (`standin`)."""
        from worldsmith.runtime.sandbox import asgi  # loaded in ASGI workers (worker._preload)

        deadline = time.monotonic() + seconds
        refusals = len(guard.GUARD.violations)
        with self._private_world(env) as scratch:
            held = sys.getrefcount(scratch)  # this frame's, the manager's, `current_conn`'s and the argument's
            for name in names:
                route = env.routes[name]
                stand_in: JsonObject = {parameter: 1 for parameter in route.path_params}
                left = deadline - time.monotonic()
                if left <= 0 or len(guard.GUARD.violations) > refusals:
                    return False
                with contextlib.suppress(Failure):
                    request = functools.partial(asgi.call, env.app, route, stand_in)
                    self.run(request, episode=None, files=("app.py",), wall_s=left)
            with contextlib.suppress(Failure):  # finalizers of what the requests dropped: the app's code
                self.run(gc.collect, episode=None, files=("app.py",))
            return (
                time.monotonic() <= deadline
                and len(guard.GUARD.violations) == refusals
                and (sys.getrefcount(scratch) <= held)
            )

    def call_route(self, episode: OpenEpisode, name: str, arguments: JsonObject) -> JsonValue:
        """Send one request to the app as generated code: 4xx answers are the tool's refusals
        (ToolError), 5xx answers and exceptions are faults of the environment."""
        from worldsmith.runtime.sandbox import asgi

        route = episode.env.routes[name]
        status, value = asgi.call(episode.env.app, route, arguments)
        if 400 <= status < 500:
            raise ToolError(f"HTTP {status}: {asgi.error_detail(value)}")
        if status >= 500:
            raise RuntimeError(f"HTTP {status} from {route.method} {route.path}: {asgi.error_detail(value)}")
        return value

    @contextmanager
    def databases(self, episode: OpenEpisode) -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
        """Read-only connections to the episode's untouched and current databases, closed on exit."""
        assert episode.conn is not None  # opened by Operations._episode
        initial = deserialize(episode.env.world, read_only=True)
        final = deserialize(snapshot(episode.conn, transactions=refuse_transaction_control), read_only=True)
        for conn in (initial, final):
            conn.row_factory = sqlite3.Row
            guard.GUARD.watch(conn)
            worldclock.bind_sql(conn, episode.env.clock)
        try:
            yield initial, final
        finally:
            initial.close()
            final.close()

    def database_files(self, episode: OpenEpisode) -> tuple[str, str]:
        """Read-only snapshot files of the untouched and the current database, in the episode's
        directory (the only files its code may read). Made afresh: whatever the episode's code left
        under their names (a link, a pipe, a journal beside them) is removed, never followed."""
        os.makedirs(episode.directory, exist_ok=True)
        assert episode.conn is not None  # opened by Operations._episode
        current = snapshot(episode.conn, transactions=refuse_transaction_control)
        dir_fd = open_directory(episode.directory)
        try:
            for name, data in (("initial.db", episode.env.world), ("final.db", current)):
                remove_side_files_at(dir_fd, name)
                create_at(dir_fd, name, data, 0o444)
        finally:
            os.close(dir_fd)
        return os.path.join(episode.directory, "initial.db"), os.path.join(episode.directory, "final.db")
