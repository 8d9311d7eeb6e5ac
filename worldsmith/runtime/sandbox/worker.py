"""The sandbox worker process: hosts episodes and runs generated tools and verifiers. Stdlib only.

Started by `worldsmith.runtime.pool` as `python -I -S -B -c ...` with a scrubbed environment (workers of
ASGI environments without `-S`: they import the web stack from site-packages before confining themselves).
It loads the modules generated code may use, confines itself (kernel layers, then the Python
guard), says hello, and then serves one request at a time over stdin/stdout frames.
"""

from __future__ import annotations

import _random
import base64
import datetime
import decimal
import gc
import importlib
import io
import json
import os
import random
import shutil
import signal
import socket
import sqlite3
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import CodeType
from typing import Any

from worldsmith.bundle.asgiapp import CLOCK, ENGINE_FACTORY
from worldsmith.bundle.codepolicy import ALLOWED_MODULES
from worldsmith.bundle.jsonvalues import json_text
from worldsmith.bundle.kinds import TOOLS_KINDS, VERIFIERS_KINDS, EnvFault, Tool, ToolsKind, VerifiersKind
from worldsmith.bundle.sqlscript import deserialize, harden, restore, snapshot
from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox import dbdiff, kernel, worldclock
from worldsmith.runtime.sandbox.guard import Guard, SandboxViolation
from worldsmith.runtime.sandbox.protocol import (
    EPISODE_OPS,
    MAX_ERROR_CHARS,
    RUNTIME_FIELDS,
    FrameReader,
    ProtocolClosed,
    ProtocolTimeout,
    ProtocolViolation,
    encode,
    process_failure,
    process_wait,
    reply_problem,
    send_within,
    truncated,
    write_frame,
)

MAX_RESULT_BYTES = 4 * 1024 * 1024
MAX_STDOUT = 64 * 1024
MAX_EVIDENCE_BYTES = 1024 * 1024  # a verifier's evidence as JSON, replaced by a marked excerpt beyond this
SAVEPOINT = "ws_call"
APP_SAVEPOINT = "ws_app"  # inside SAVEPOINT, for ASGI apps' own transactions
# Modules that allowed modules import lazily; loaded before the filesystem is closed.
EXTRA_PRELOAD = ("_strptime", "encodings.idna", "encodings.ascii", "encodings.latin_1", "json.decoder", "json.encoder")

#: Requests that run generated code or read an episode's database. Under strict isolation each runs
#: in a process of its own, forked from the worker (which stays clean) and gone with its answer.
RUN_OPS = frozenset({"call", "verify", "snapshot", "diff", "routes", "check_env"})

GUARD: Guard  # set in main()
# What every run of generated code starts from (taken before any runs; C-level callables, which
# generated code cannot rebind): `random`'s shared generator reseeded, a fresh decimal context.
_RANDOM = random._inst
_RANDOM_SEED = _random.Random.seed
_DECIMAL_CONTEXT = decimal.Context()
_SET_DECIMAL_CONTEXT = decimal.setcontext
_RUNTIME_SQL = [False]  # True while the runtime's own transaction control runs inside a call


@contextmanager
def _runtime_sql() -> Iterator[None]:
    _RUNTIME_SQL[0] = True
    try:
        yield
    finally:
        _RUNTIME_SQL[0] = False


def _refuse_transaction_control(statement: str) -> bool:
    """The transaction gate of episode connections (`harden`): while generated code runs, only the
    runtime's own savepoints may be opened, released or rolled back; tool SQL doing it is refused."""
    if not GUARD.active or _RUNTIME_SQL[0]:
        return False
    GUARD.refuse(
        "database", f"transaction control ({statement}) from tool SQL refused: the runtime owns the call's transaction"
    )
    return True


class EpisodeConnection(sqlite3.Connection):
    """The connection tools receive: the runtime owns transactions and connection settings."""

    #: How rows read during a call come back, and the savepoints the runtime opens around each call.
    CALL_ROW_FACTORY: Any = sqlite3.Row
    CALL_SAVEPOINTS: tuple[str, ...] = (SAVEPOINT,)

    def commit(self) -> None:  # the runtime commits when the tool returns
        return None

    def rollback(self) -> None:  # undo this call's writes so far
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"ROLLBACK TO {SAVEPOINT}")

    def close(self) -> None:
        return None

    def executescript(self, *args: Any, **kwargs: Any) -> Any:
        raise sqlite3.NotSupportedError("executescript is not available to tools; use execute()")

    def _refused(self, *args: Any, **kwargs: Any) -> Any:
        raise GUARD.refuse("database", "changing the episode connection's settings is refused")

    set_authorizer = set_progress_handler = set_trace_callback = setlimit = _refused
    enable_load_extension = load_extension = deserialize = serialize = backup = _refused


class AppConnection(EpisodeConnection):
    """The connection an ASGI app's engine hands out: its commits and rollbacks act on an inner
    savepoint, so a rollback after a commit (SQLAlchemy ends every session with one) keeps what was
    committed, while the runtime can still undo the whole call."""

    CALL_ROW_FACTORY = None  # SQLAlchemy reads plain tuples
    CALL_SAVEPOINTS = (SAVEPOINT, APP_SAVEPOINT)

    def commit(self) -> None:
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"RELEASE {APP_SAVEPOINT}")
            sqlite3.Connection.execute(self, f"SAVEPOINT {APP_SAVEPOINT}")

    def rollback(self) -> None:
        with _runtime_sql():
            sqlite3.Connection.execute(self, f"ROLLBACK TO {APP_SAVEPOINT}")


#: What the runtime sets around each call, by connection class (its row factory, the savepoints it
#: opens), kept here: generated code may rebind the classes' attributes.
_CALL_SETTINGS: dict[type, tuple[Any, tuple[str, ...]]] = {
    EpisodeConnection: (EpisodeConnection.CALL_ROW_FACTORY, EpisodeConnection.CALL_SAVEPOINTS),
    AppConnection: (AppConnection.CALL_ROW_FACTORY, AppConnection.CALL_SAVEPOINTS),
}
_ROW_FACTORY = sqlite3.Connection.row_factory
_TOTAL_CHANGES = sqlite3.Connection.total_changes
_IN_TRANSACTION = sqlite3.Connection.in_transaction


@dataclass
class LoadedEnv:
    key: str
    world: bytes
    tools_kind: ToolsKind
    code: CodeType  # the tools' code: tools.py, or an app with its engine creation rewritten
    verifiers_kind: VerifiersKind
    verifiers_code: CodeType
    tool_names: list[str]
    clock: str | None = None  # ISO instant the code's clock reads answer (None: the real time); see worldclock
    app: Any = None  # an app object, made on first use
    routes: dict[str, Any] = field(default_factory=dict)
    load_error: str | None = None  # strict isolation: why the tools do not load (checked once)


@dataclass
class Episode:
    """An open episode. Fast isolation: its database in memory (`conn`), its tools loaded at open.
    Strict isolation: its database is the file `db_path` in its directory, opened (with its tools)
    only in the processes that serve its requests; the worker itself never reads it."""

    id: str
    env: LoadedEnv
    conn: EpisodeConnection | None
    directory: str
    tools: dict[str, Tool] | None = None

    @property
    def db_path(self) -> str:
        return os.path.join(self.directory, "episode.db")


@dataclass
class RunProcess:
    """A process forked to serve requests (strict isolation): the worker reads its replies, and writes
    requests to `requests` if it serves more than the one it was forked for."""

    pid: int
    replies: FrameReader
    requests: int | None = None


class Failure(Exception):
    """An operation's outcome that is not a success: becomes the reply's status/error/limit."""

    def __init__(self, status: str, error: str, limit: str | None = None, refused_module: str | None = None):
        super().__init__(error)
        self.status, self.error, self.limit, self.refused_module = status, error, limit, refused_module


def _app_module_name(key: str) -> str:
    """The sys.modules name of an ASGI environment's app (one per runtime key)."""
    return "worldsmith_app_" + "".join(c if c.isalnum() else "_" for c in key)


def _capped_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """A verifier's evidence as sent back: whole up to MAX_EVIDENCE_BYTES of JSON, else a marked excerpt."""
    try:
        text = json_text(evidence)
    except (ValueError, TypeError, RecursionError) as exc:
        raise Failure("env_error", f"verifier evidence cannot be sent: {type(exc).__name__}: {exc}") from None
    if len(text) <= MAX_EVIDENCE_BYTES:
        return evidence
    return {"truncated": truncated(text, MAX_EVIDENCE_BYTES)}


_TRACEBACK = BaseException.__traceback__  # read through the descriptor: no attribute hook of the code runs


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


class Worker:
    """Serves one request at a time; lends itself to the environments' kinds as their `Host`
    (worldsmith/bundle/kinds.py), which decide how each environment is opened, called and verified."""

    def __init__(self, config: dict[str, Any], out: io.BufferedWriter):
        self.config = config
        self.out = out
        self.scratch: str = config["scratch"]
        self.envs: dict[str, LoadedEnv] = {}
        self.episodes: dict[str, Episode] = {}
        # ASGI environments: the connection their engines hand out right now
        self.current_conn: sqlite3.Connection | None = None
        self.seed = 0  # `random`'s seed for the generated code of the request at hand
        # "strict": every request of RUN_OPS runs in a process forked for it (`_forked`); "fast":
        # here, episodes of the worker's one environment sharing this interpreter
        self.strict = config.get("isolation") == "strict"
        self.run_process = False  # True in a process forked for one request
        self.live: dict[str, RunProcess] = {}  # episode id -> its process (strict), least recently used first
        # strict: the socket to the parent over which episode processes' pipes are handed to it, and the
        # pids of those handed (the parent speaks to them directly; the worker still stops and reaps them)
        channel_fd = config.get("channel_fd")
        self.channel = socket.socket(fileno=channel_fd) if self.strict and isinstance(channel_fd, int) else None
        self.handed: dict[str, int] = {}
        self.ended: dict[str, str] = {}  # how handed processes found ended (`_sweep_handed`) ended, until reaped

    @staticmethod
    def _fresh_state(seed: int) -> None:
        """`random` and `decimal` as no earlier call left them: the shared generator reseeded with
        `seed` (the parent's, per call and recorded for replay; 0 outside calls), a fresh context."""
        _RANDOM_SEED(_RANDOM, seed)
        _RANDOM.gauss_next = None
        _SET_DECIMAL_CONTEXT(_DECIMAL_CONTEXT.copy())

    # -- generated code (the kinds' Host) ------------------------------------------------------
    def run(self, fn: Callable[[], Any], *, episode: Episode | None, files: tuple[str, ...]) -> tuple[Any, str]:
        """Run `fn` as generated code; returns (result, captured stdout) or raises Failure."""
        stdout, stderr = sys.stdout, sys.stderr
        capture = io.StringIO()
        sys.stdout = sys.stderr = capture
        before = len(GUARD.violations)
        self._fresh_state(self.seed)
        result: Any = None
        # an exception the code raised: its kind, its text (made while the guard is on: its class is
        # generated code) and its traceback (read after, by the worker, from frames alone)
        outcome: tuple[str, str, Any] | None = None
        try:
            with GUARD.untrusted(
                episode_dir=episode.directory if episode else None,
                wall_s=self.config["call_timeout_s"],
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
            GUARD.refuse("memory", "call exceeded the worker's memory limit")
        finally:
            sys.stdout, sys.stderr = stdout, stderr
        if outcome is not None:
            kind, text, trace = outcome
            text += _code_location(trace, files)
            if kind == "recursion":
                GUARD.refuse("recursion", text)
            elif len(GUARD.violations) == before:
                raise Failure(kind, text)
        # restores what it names; the worker (strict: the episode's process) is retired for it
        tampered = GUARD.state.changed()
        if tampered:
            GUARD.refuse("module_state", f"modified module state: {', '.join(tampered[:10])}")
        if len(GUARD.violations) > before:
            violation = GUARD.violations[before]
            text = f"sandbox limit {violation.limit}: {violation.detail}"
            raise Failure("env_error", text, violation.limit, violation.module)
        return result, truncated(capture.getvalue(), MAX_STDOUT)

    def module(self, code: CodeType, name: str, episode: Episode | None) -> dict[str, Any]:
        """The namespace left by running `code` as module `name` of generated code."""
        namespace = GUARD.namespace(name)
        self.run(lambda: exec(code, namespace), episode=episode, files=(code.co_filename,))
        return namespace

    # -- operations ----------------------------------------------------------------------
    def op_load_env(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        kind = TOOLS_KINDS[header.get("tools_kind")]
        if kind.web_stack and not self.config.get("frameworks"):
            raise Failure("env_error", "an ASGI environment needs a worker with the web stack")
        env = self.envs[header["env"]] = LoadedEnv(
            key=header["env"],
            world=blobs[0],
            tools_kind=kind,
            code=kind.compile(header),
            verifiers_kind=VERIFIERS_KINDS[header.get("verifiers_kind")],
            verifiers_code=compile(header["verifiers"], "verifiers.py", "exec", dont_inherit=True),
            tool_names=list(header["tool_names"]),
            clock=header.get("clock"),
        )
        if self.strict and header.get("check", True):  # the tools load? (once, in a process of its own)
            reply, _ = self._forked({"op": "check_env", "env": env.key, "timeout_s": header.get("timeout_s")}, [])
            if reply.get("status") != "ok":
                env.load_error = str(reply.get("error"))
        gc.freeze()  # what forked processes share stays untouched by their collections (fewer page copies)
        return {}

    def op_check_env(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """Open the environment's tools once on a private copy of its world (strict isolation's load check)."""
        env = self.envs[header["env"]]
        conn = self._memory_connection(env, env.world)
        env.tools_kind.open(self, env, Episode(id="check", env=env, conn=conn, directory=self.scratch))
        return {}

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

    def start_app(self, env: LoadedEnv) -> dict[str, Any]:
        """Run app.py once (on a private copy of the world) and read its routes (by tool name)."""
        if env.app is not None:
            return env.routes
        from worldsmith.runtime.sandbox import asgi

        scratch = deserialize(env.world, factory=AppConnection, transactions=_refuse_transaction_control)
        worldclock.bind_sql(scratch, env.clock)
        for name in (SAVEPOINT, APP_SAVEPOINT):  # what the app's commits and rollbacks work within
            sqlite3.Connection.execute(scratch, f"SAVEPOINT {name}")
        self.current_conn = scratch
        # a registered module: pydantic and SQLAlchemy resolve a class's annotations through sys.modules
        module = types.ModuleType(_app_module_name(env.key))
        namespace = module.__dict__
        namespace.update(GUARD.namespace(module.__name__))
        namespace[ENGINE_FACTORY] = self._engine
        namespace[CLOCK] = worldclock.app_clock
        sys.modules[module.__name__] = module
        try:
            self.run(lambda: exec(env.code, namespace), episode=None, files=("app.py",))
            from fastapi import FastAPI

            apps = sorted(
                (v for v in namespace.values() if isinstance(v, FastAPI)), key=lambda v: v is not namespace.get("app")
            )
            if not apps:
                raise Failure("env_error", "app.py defines no FastAPI application")
            routes, _ = self.run(lambda: asgi.routes_of(apps[0]), episode=None, files=("app.py",))
        finally:
            self.current_conn = None
            sqlite3.Connection.close(scratch)
        env.app, env.routes = apps[0], routes
        return env.routes

    def op_unload_env(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        env = self.envs.pop(header["env"], None)
        for episode in [e for e in self.episodes.values() if e.env is env]:
            self._stop_episode_process(episode.id)
        if env is not None and env.app is not None:
            sys.modules.pop(_app_module_name(env.key), None)
        return {}

    def op_routes(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """The tools of an ASGI environment's app: one JSON schema per route."""
        env = self.envs.get(header["env"])
        schemas = env.tools_kind.schemas(self, env) if env is not None else None
        if schemas is None:
            raise Failure("env_error", f"ASGI environment {header['env']} is not loaded in this worker")
        return {"tools": schemas}

    def call_route(self, episode: Episode, name: str, arguments: dict[str, Any]) -> Any:
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

    def _episode(self, header: dict[str, Any]) -> Episode:
        try:
            episode = self.episodes[header["episode"]]
        except KeyError:
            raise Failure("env_error", f"episode {header['episode']} is not open in this worker") from None
        if episode.conn is None:  # strict isolation, in the request's own process
            episode.conn = self._file_connection(episode)
        return episode

    def _tools(self, episode: Episode) -> dict[str, Tool]:
        if episode.tools is None:
            episode.tools = episode.env.tools_kind.open(self, episode.env, episode)
        return episode.tools

    @staticmethod
    def _connection_class(env: LoadedEnv) -> type[EpisodeConnection]:
        return AppConnection if env.tools_kind.app_transactions else EpisodeConnection

    def _memory_connection(self, env: LoadedEnv, data: bytes) -> EpisodeConnection:
        """A private in-memory episode database holding `data`, hardened and watched."""
        conn = deserialize(data, factory=self._connection_class(env), transactions=_refuse_transaction_control)
        conn.row_factory = sqlite3.Row
        GUARD.watch(conn)
        worldclock.bind_sql(conn, env.clock)
        return conn

    def _file_connection(self, episode: Episode) -> EpisodeConnection:
        """The episode's database file, opened like an in-memory episode database (strict isolation);
        made from the world on first use."""
        if not os.path.exists(episode.db_path):
            _write_db(episode.db_path, episode.env.world)
        conn = sqlite3.connect(
            episode.db_path, isolation_level=None, check_same_thread=False, factory=self._connection_class(episode.env)
        )
        sqlite3.Connection.execute(conn, "PRAGMA synchronous = OFF")  # the file lives as long as the episode
        # one process at a time has the file open (`_forked`): it keeps its lock, no re-check per statement
        sqlite3.Connection.execute(conn, "PRAGMA locking_mode = EXCLUSIVE")
        harden(conn, transactions=_refuse_transaction_control)
        conn.row_factory = sqlite3.Row
        GUARD.watch(conn)
        worldclock.bind_sql(conn, episode.env.clock)
        return conn

    def op_open(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        env = self.envs.get(header["env"])
        if env is None:
            raise Failure("env_error", f"environment {header['env']} is not loaded in this worker")
        # The episode's file area: the only place its code may open files; created by the runtime
        # when it puts files there (verifiers' database files; strict isolation: the database),
        # removed with the episode.
        directory = os.path.join(self.scratch, header["episode"])
        if self.strict:
            if env.load_error is not None:
                raise Failure("env_error", env.load_error)
            episode = Episode(id=header["episode"], env=env, conn=None, directory=directory)
            if blobs:
                _write_db(episode.db_path, blobs[0])
            self.episodes[episode.id] = episode
            return {}
        conn = self._memory_connection(env, blobs[0] if blobs else env.world)
        episode = Episode(id=header["episode"], env=env, conn=conn, directory=directory)
        self._tools(episode)
        self.episodes[episode.id] = episode
        return {}

    def op_call(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        episode = self._episode(header)
        name = header["tool"]
        tool = self._tools(episode).get(name)
        if tool is None:
            raise Failure("tool_error", f"unknown tool {name!r}")
        conn = episode.conn
        assert conn is not None
        # read through sqlite3.Connection and the runtime's own constants: tools may plant attributes
        # on their connection or its class, which must not run here with the guard off
        row_factory, savepoints = _CALL_SETTINGS[self._connection_class(episode.env)]
        _ROW_FACTORY.__set__(conn, row_factory)
        arguments = header.get("arguments") or {}
        changes = _TOTAL_CHANGES.__get__(conn)
        for savepoint in savepoints:
            sqlite3.Connection.execute(conn, f"SAVEPOINT {savepoint}")
        self.current_conn = conn
        try:
            text, stdout = self.run(
                lambda: json_text(tool(arguments)),
                episode=episode,
                files=(episode.env.tools_kind.code_file,),
            )
            if len(text) > MAX_RESULT_BYTES:
                raise Failure(
                    "env_error", f"tool result of {len(text)} bytes exceeds {MAX_RESULT_BYTES}", "result_size"
                )
        except BaseException:
            self._end_call(conn, commit=False)
            raise
        finally:
            self.current_conn = None
        self._end_call(conn, commit=True)
        changed = _TOTAL_CHANGES.__get__(conn) != changes
        return {"status": "ok", "value": json.loads(text), "stdout": stdout, "changed": changed}

    @staticmethod
    def _end_call(conn: sqlite3.Connection, *, commit: bool) -> None:
        try:
            if not commit:
                sqlite3.Connection.execute(conn, f"ROLLBACK TO {SAVEPOINT}")
            sqlite3.Connection.execute(conn, f"RELEASE {SAVEPOINT}")
        except sqlite3.Error:
            if _IN_TRANSACTION.__get__(conn):  # the tool ended our savepoint itself; leave no transaction open
                sqlite3.Connection.execute(conn, "COMMIT" if commit else "ROLLBACK")

    def op_snapshot(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        episode = self._episode(header)
        return {}, [snapshot(episode.conn, transactions=_refuse_transaction_control)]

    def op_restore(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        if self.strict:  # the bytes become the file; read only by the episode's own processes
            episode = self.episodes.get(header["episode"])
            if episode is None:
                raise Failure("env_error", f"episode {header['episode']} is not open in this worker")
            self._stop_episode_process(episode.id)  # it holds the database open
            _write_db(episode.db_path, blobs[0] if blobs else episode.env.world)
            return {}
        episode = self._episode(header)
        restore(episode.conn, blobs[0] if blobs else episode.env.world, transactions=_refuse_transaction_control)
        return {}

    def op_diff(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        before = deserialize(blobs[0], read_only=True)
        after = deserialize(blobs[1], read_only=True) if len(blobs) > 1 else self._episode(header).conn
        try:
            return {"diff": dbdiff.diff(before, after)}
        finally:
            before.close()

    @contextmanager
    def databases(self, episode: Episode) -> Iterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
        """Read-only connections to the episode's untouched and current databases, closed on exit."""
        initial = deserialize(episode.env.world, read_only=True)
        final = deserialize(snapshot(episode.conn, transactions=_refuse_transaction_control), read_only=True)
        for conn in (initial, final):
            conn.row_factory = sqlite3.Row
            GUARD.watch(conn)
            worldclock.bind_sql(conn, episode.env.clock)
        try:
            yield initial, final
        finally:
            initial.close()
            final.close()

    def database_files(self, episode: Episode) -> tuple[str, str]:
        """Read-only snapshot files of the untouched and the current database, in the episode's
        directory (the only files its code may read)."""
        os.makedirs(episode.directory, exist_ok=True)
        paths = []
        current = snapshot(episode.conn, transactions=_refuse_transaction_control)
        for name, data in (("initial.db", episode.env.world), ("final.db", current)):
            path = os.path.join(episode.directory, name)
            if os.path.exists(path):
                os.chmod(path, 0o600)
            with open(path, "wb") as handle:
                handle.write(data)
            os.chmod(path, 0o444)
            paths.append(path)
        return paths[0], paths[1]

    def op_verify(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        episode = self._episode(header)
        kind = episode.env.verifiers_kind
        verdict, evidence = kind.verify(self, episode, header["verifier"], header.get("answer") or "")
        return {"verdict": verdict.value, "evidence": _capped_evidence(evidence)}

    def op_close(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        episode = self.episodes.pop(header["episode"], None)
        self._stop_episode_process(header["episode"])
        if episode is not None:
            if episode.conn is not None:
                sqlite3.Connection.close(episode.conn)
            shutil.rmtree(episode.directory, ignore_errors=True)
        return {}

    def op_ping(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        self._sweep_handed()
        processes = {episode: process.pid for episode, process in self.live.items()} | self.handed
        return {"episodes": len(self.episodes), "envs": len(self.envs), "processes": processes}

    # -- loop ----------------------------------------------------------------------------
    # -- strict isolation: processes forked per episode and per request ---------------------------
    def _forked(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        """Serve a request of RUN_OPS in a process forked from this worker (which runs no generated
        code itself and stays clean) and return its checked reply. Tool calls, snapshots and diffs go to
        their episode's own process, forked at its first request and kept (at most `episode_processes`,
        the least recently used stopped first); every other request (verification above all) gets a
        process of its own, gone with its answer (the episode's own process is stopped first: one process
        at a time has an episode's database open, and keeps it locked). A process past the request's
        deadline, dead, or answering outside the reply contract is stopped and the request is an
        env_error; its episode's next call forks a fresh one."""
        episode_id = header.get("episode")
        self._sweep_handed()
        self._reap_handed(episode_id)  # the parent gave its channel up: the process goes before another opens
        if header.get("op") in EPISODE_OPS and episode_id in self.episodes:
            process = self.live.pop(episode_id, None)
            if process is not None and not self._send(process, header, blobs):
                _stop(process)  # gone since its last call: its next one starts afresh
                process = None
            if process is None:
                while len(self.live) >= max(int(self.config.get("episode_processes", 128)), 1):
                    self._stop_least_recent()
                process = self._spawn(header, blobs, persistent=True)
            try:
                reply, reply_blobs = self._answer(process, header)
            except Failure:
                _stop(process)
                raise
            if reply.pop("retire", False):  # it ran code that broke a limit: its next call starts afresh
                _stop(process)
            elif header.get("direct") is True and self._hand_over(episode_id, process):
                reply["channel"] = True
            else:
                self.live[episode_id] = process
            return reply, reply_blobs
        if episode_id in self.live:  # it holds the episode's database (locked): it goes, its next call forks anew
            self._stop_episode_process(episode_id)
        process = self._spawn(header, blobs, persistent=False)
        try:
            reply, reply_blobs = self._answer(process, header)
            reply.pop("retire", None)
            return reply, reply_blobs
        finally:
            _stop(process)

    def _stop_least_recent(self) -> bool:
        """Stop the episode process used least recently; False if none is kept."""
        if not self.live:
            return False
        _stop(self.live.pop(next(iter(self.live))))
        return True

    def _stop_episode_process(self, episode_id: str) -> None:
        process = self.live.pop(episode_id, None)
        if process is not None:
            _stop(process)
        self._reap_handed(episode_id)

    def _hand_over(self, episode_id: str, process: RunProcess) -> bool:
        """Give the parent `process`'s pipes (SCM_RIGHTS over the channel socket, tagged with the
        episode id): its next requests go to it directly. The worker keeps only its pid, to stop and
        reap it when the parent gives the channel up. False (the worker keeps the process) when there
        is no channel, or the process wrote more than its reply (the parent must not inherit that)."""
        if self.channel is None or process.requests is None or process.replies.pending():
            return False
        try:
            socket.send_fds(self.channel, [episode_id.encode()], [process.replies.fd, process.requests])
        except OSError:
            return False
        for fd in (process.replies.fd, process.requests):
            os.close(fd)
        self.handed[episode_id] = process.pid
        return True

    def _reap_handed(self, episode_id: Any, grace_s: float = 0.0) -> str | None:
        """Stop the process of `episode_id` handed to the parent (if any), given `grace_s` to end by
        itself; returns how it ended (also when `_sweep_handed` found it ended)."""
        if not isinstance(episode_id, str):
            return None
        pid = self.handed.pop(episode_id, None)
        ended = self.ended.pop(episode_id, None)
        return ended if pid is None else _ending(_end(pid, grace_s))

    def _sweep_handed(self) -> None:
        """Reap the handed processes that ended (their channel given up, or dead): no zombie waits for
        its episode's next request; how each ended is kept for `reap`."""
        for episode_id, pid in list(self.handed.items()):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                del self.handed[episode_id]
                self.ended[episode_id] = _ending(status)

    def op_reap(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """The parent gave up an episode's direct channel (its process timed out, died, broke the reply
        contract or ran code that broke a limit): stop the process and say how it ended."""
        grace = header.get("grace_s")
        ending = self._reap_handed(header.get("episode"), float(grace) if isinstance(grace, (int, float)) else 0.0)
        return {"ending": ending}

    def _spawn(self, header: dict[str, Any], blobs: list[bytes], *, persistent: bool) -> RunProcess:
        """Fork a process that serves `header` (and, if `persistent`, the requests sent to it after).
        Short of descriptors or processes, kept episode processes are stopped (least recent first)
        until it can; failing that the request is an env_error."""
        while True:
            opened: list[int] = []
            try:
                replies_r, replies_w = os.pipe()
                opened += (replies_r, replies_w)
                requests_r, requests_w = os.pipe() if persistent else (-1, -1)
                opened += (requests_r, requests_w)
                pid = os.fork()
                break
            except OSError as exc:
                for fd in opened:
                    if fd >= 0:
                        os.close(fd)
                if not self._stop_least_recent():
                    raise Failure(
                        "env_error", f"sandbox worker cannot start a process for the request: {exc}"
                    ) from None
        if pid == 0:  # the request's process: never returns
            code = 0
            try:
                os.close(replies_r)
                if persistent:
                    os.close(requests_w)
                self._become_run_process(header, keep=(replies_w, requests_r))
                self._serve_requests(header, blobs, replies_w, requests_r if persistent else None)
            except BaseException:  # noqa: BLE001 - the worker reports the missing reply
                code = 70
            finally:
                os._exit(code)
        os.close(replies_w)
        if persistent:
            os.close(requests_r)
            os.set_blocking(requests_w, False)  # `_send` waits for room itself, up to the request's deadline
        reader = FrameReader(replies_r, max_blobs=self.config["memory_mb"] * 1024 * 1024)
        return RunProcess(pid=pid, replies=reader, requests=requests_w if persistent else None)

    def _serve_requests(self, header: dict[str, Any], blobs: list[bytes], out_fd: int, in_fd: int | None) -> None:
        """In a forked process: answer the request it was forked for, then (persistent) each request
        the worker sends, until the worker closes the pipe."""
        out = os.fdopen(out_fd, "wb")
        requests = FrameReader(in_fd) if in_fd is not None else None
        while True:
            reply, reply_blobs = self.handle(header, blobs)
            write_frame(out, reply, reply_blobs)
            if requests is None:
                return
            try:
                header, blobs = requests.read()
            except ProtocolClosed:
                return

    def _send(self, process: RunProcess, header: dict[str, Any], blobs: list[bytes]) -> bool:
        """Write a request to a live episode process; False if it is gone or does not take it in time."""
        assert process.requests is not None
        return send_within(process.requests, encode(header, blobs), time.monotonic() + self._wait(header)) is None

    def _wait(self, header: dict[str, Any]) -> float:
        """How long a request's process may take: the parent's deadline less half the grace."""
        return process_wait(
            header.get("timeout_s"), float(self.config.get("grace_s", 2.0)), self.config["call_timeout_s"]
        )

    def _answer(self, process: RunProcess, header: dict[str, Any]) -> tuple[dict[str, Any], list[bytes]]:
        """The reply `process` writes, checked; Failure past the deadline, on its death, or for a reply
        outside the contract."""
        wait = self._wait(header)
        try:
            reply, blobs = process.replies.read(time.monotonic() + wait)
        except ProtocolTimeout:
            raise Failure("env_error", process_failure("timeout", f"{wait:g} s"), "timeout") from None
        except ProtocolClosed:
            ending = _ending(_stop(process, grace_s=1.0))
            raise Failure("env_error", process_failure("crash", ending), "crash") from None
        except ProtocolViolation as exc:
            problem: str | None = str(exc)
        else:
            problem = reply_problem(reply, header.get("id"))
        if problem is not None:
            raise Failure("env_error", process_failure("protocol", problem), "protocol")
        for key in RUNTIME_FIELDS:
            reply.pop(key, None)
        return reply, blobs

    def _become_run_process(self, header: dict[str, Any], *, keep: tuple[int, int]) -> None:
        """In a freshly forked process: drop the worker's channels, other episodes and their processes,
        then confine this process to its episode's directory (Landlock), without new processes and
        under the whole seccomp deny list (`kernel.confine_run`); it dies with the worker."""
        self.run_process = True
        kernel.die_with_parent()
        os.dup2(1, 0)  # the request channel becomes /dev/null (as stdout is); SQLite never takes fds 0-2
        channels = [self.out.fileno()]  # the reply channel to the parent, and every other process's pipes
        if self.channel is not None:  # generated code never reaches the socket the parent takes pipes from
            channels.append(self.channel.detach())
            self.channel = None
        self.handed, self.ended = {}, {}
        for process in self.live.values():
            channels += [fd for fd in (process.requests, process.replies.fd) if fd is not None]
        for fd in channels:
            if fd not in keep:
                os.close(fd)
        self.live = {}
        episode = self.episodes.get(header.get("episode"))  # type: ignore[arg-type]
        self.episodes = {episode.id: episode} if episode is not None else {}
        env_key = episode.env.key if episode is not None else header.get("env")
        self.envs = {key: env for key, env in self.envs.items() if key == env_key}
        writable = []
        if episode is not None:
            os.makedirs(episode.directory, exist_ok=True)
            writable.append(episode.directory)
        kernel.confine_run(writable)

    # -- requests ------------------------------------------------------------------------
    def _request_env(self, header: dict[str, Any]) -> LoadedEnv | None:
        """The loaded environment a request is for (through its episode, else its `env`), if any."""
        episode = self.episodes.get(header.get("episode"))  # type: ignore[arg-type]
        return episode.env if episode is not None else self.envs.get(header.get("env"))  # type: ignore[arg-type]

    def _set_clock(self, header: dict[str, Any]) -> None:
        """The world's clock for the request's code: its environment's instant, its skew (`worldclock`)."""
        env = self._request_env(header)
        clock = env.clock if env is not None else None
        try:
            worldclock.set_clock(clock, _skew(header.get("skew_s")))
        except ValueError:
            raise Failure("env_error", f"the world's clock {clock!r} is not an ISO instant (manifest clock)") from None

    def handle(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        started = time.perf_counter()
        op = str(header.get("op"))
        if self.strict and not self.run_process and op in RUN_OPS:
            handler = self._forked
        else:
            handler = getattr(self, "op_" + op, None)
        reply_blobs: list[bytes] = []
        seed = header.get("seed")
        self.seed = seed if isinstance(seed, int) and 0 <= seed < 2**64 else 0
        try:
            self._set_clock(header)
            if handler is None:
                raise Failure("env_error", f"unknown operation {header.get('op')!r}")
            result = handler(header, blobs)
            if isinstance(result, tuple):
                result, reply_blobs = result
            reply = {"status": "ok", **result}
        except Failure as failure:
            reply = {
                "status": failure.status,
                "error": failure.error,
                "limit": failure.limit,
                "refused_module": failure.refused_module,
            }
        except EnvFault as fault:
            reply = {"status": "env_error", "error": str(fault), "limit": None}
        except MemoryError:
            reply = {
                "status": "env_error",
                "error": "sandbox limit memory: worker exceeded its memory limit",
                "limit": "memory",
            }
            GUARD.refuse("memory", "worker out of memory")
        except SandboxViolation as violation:
            reply = {
                "status": "env_error",
                "error": f"sandbox limit {violation}",
                "limit": violation.limit,
                "refused_module": violation.module,
            }
        except Exception as exc:  # noqa: BLE001 - a fault of the worker itself: report it, keep serving
            reply = {
                "status": "env_error",
                "error": f"sandbox worker fault: {type(exc).__name__}: {exc}",
                "limit": None,
            }
        if isinstance(reply.get("error"), str):  # a forked process's reply is cut already: keep its mark
            reply["error"] = truncated(reply["error"], MAX_ERROR_CHARS + (64 if handler == self._forked else 0))
        reply["seconds"] = time.perf_counter() - started
        reply["retire"] = bool(GUARD.violations)
        if "id" in header:  # the parent accepts only the reply to the request it sent
            reply["id"] = header["id"]
        return reply, reply_blobs

    def serve(self) -> None:
        reader = FrameReader(0)
        while True:
            try:
                header, blobs = reader.read()
            except ProtocolClosed:
                return
            reply, reply_blobs = self.handle(header, blobs)
            write_frame(self.out, reply, reply_blobs)


#: The largest clock skew a request may ask for (seconds; a century).
MAX_SKEW_S = 100 * 365 * 86400.0


def _skew(value: Any) -> float:
    """A request's clock skew (`skew_s`: seconds every real-time source of its code is shifted by,
    see worldclock): a finite number within MAX_SKEW_S, else 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_SKEW_S:
        return float(value)
    return 0.0


def _write_db(path: str, data: bytes) -> None:
    """Make `data` (a serialized database) the database file at `path`, whole or not at all; a
    journal left by a killed process goes with the file it belonged to."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fresh = path + ".new"
    with open(fresh, "wb") as handle:
        handle.write(data)
    for stale in (path + "-journal", path + "-wal", path + "-shm"):
        if os.path.lexists(stale):
            os.unlink(stale)
    os.replace(fresh, path)


def _ending(status: int) -> str:
    """How a request's process that closed its pipe without a whole reply ended, from its wait status."""
    if os.WIFSIGNALED(status):
        return f"was killed by {signal.Signals(os.WTERMSIG(status)).name}"
    return f"exited with status {os.WEXITSTATUS(status)} without an answer"


def _stop(process: RunProcess, grace_s: float = 0.0) -> int:
    """End a request's process: its pipes closed, given up to `grace_s` to exit by itself, then
    killed; returns its wait status."""
    for fd in (process.requests, process.replies.fd):
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass
    return _end(process.pid, grace_s)


def _end(pid: int, grace_s: float) -> int:
    """Wait up to `grace_s` for child `pid` to exit by itself, then kill it; returns its wait status."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        time.sleep(0.002)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    return os.waitpid(pid, 0)[1]


def _preload(frameworks: bool) -> None:
    for name in sorted(ALLOWED_MODULES - {"__future__"}) + list(EXTRA_PRELOAD):
        importlib.import_module(name)
    datetime.datetime.strptime("2024-01-01", "%Y-%m-%d")  # warms _strptime's caches
    for encoder, decoder in ((base64.b32encode, base64.b32decode), (base64.b85encode, base64.b85decode)):
        decoder(encoder(b"warm"))  # base64 builds these tables on first use: clean before ModuleState records
    base64.a85encode(b"warm")
    if frameworks:
        from worldsmith.runtime.sandbox import asgi

        asgi.preload()


def main() -> None:
    global GUARD
    config = json.loads(sys.argv[1])
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # an over-long write fails with EFBIG instead of killing us
    frameworks = bool(config.get("frameworks"))
    _preload(frameworks)
    scratch = config["scratch"]
    os.makedirs(scratch, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(scratch, config["uid"], config["uid"])
    GUARD = Guard(frameworks=frameworks)
    strict = config.get("isolation") == "strict"
    layers = kernel.confine(
        uid=config["uid"],
        memory_bytes=config["memory_mb"] * 1024 * 1024,
        file_bytes=config["file_size_mb"] * 1024 * 1024,
        cpu_seconds=config["lifetime_cpu_s"],
        read_paths=list(GUARD.read_roots),
        write_paths=[scratch],
        zygote=strict,
        open_files=kernel.OPEN_FILES + (2 * int(config.get("episode_processes", 128)) + 32 if strict else 0),
    )
    layers["isolation"] = (
        "strict (episodes and requests in processes forked from this worker)"
        if strict
        else "fast (episodes of one environment share this worker)"
    )

    GUARD.install()
    sys.setrecursionlimit(config.get("recursion_limit", 1000))
    write_frame(out, {"status": "ok", "op": "hello", "pid": os.getpid(), "layers": layers})
    Worker(config, out).serve()


if __name__ == "__main__":
    main()
