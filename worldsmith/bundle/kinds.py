"""The kinds of world: how an environment's tools and verifiers are written, loaded, called and judged.

A bundle's manifest names its two kinds (`tools_kind`, `verifiers_kind`; unset means native). Each
kind is one object here: it knows its files, what the parent sends a sandbox worker to load it, how
the worker opens and calls it (through the `Host` the worker lends it: confinement, databases and
apps are the worker's) and how a verifier's result becomes a `Verdict`.

- tools: `NativeTools`, plain functions of tools.py called with the episode's connection (tools.json
  derived from their signatures); `AppTools`, the routes of a FastAPI app in app.py as written for
  the AgentWorldModel-1K release, called in-process (tools.json recorded from the routes).
- verifiers: `NativeVerifiers`, `verify(initial, final, answer)` on read-only connections, answering
  {"status": complete|partial|incomplete, "evidence": {...}}; `ReleaseCodeVerifiers` and
  `ReleaseSqlVerifiers`, the release's two verifier modes, on read-only copies of the database files.

Stdlib only: worldsmith/runtime/sandbox/worker.py imports this module before it confines itself.
"""

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from types import CodeType
from typing import Any, ClassVar, Protocol, TypedDict

from worldsmith.bundle.asgiapp import check_app_source, compile_app
from worldsmith.bundle.codepolicy import check_source
from worldsmith.bundle.jsonvalues import json_text
from worldsmith.errors import WorldsmithError
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.verdict import VERIFIER_VERDICTS, Verdict

#: A tool as the worker calls it: with the call's arguments, on the episode it was opened for; it
#: returns what its code returns (made JSON when the reply is written).
Tool = Callable[[JsonObject], Any]


class ToolsCode(TypedDict, total=False):
    """The fields of a worker's `load_env` request that carry the tools' code: one, by kind."""

    tools: str  # native: tools.py
    app: str  # asgi: app.py


class EnvFault(WorldsmithError):
    """The environment's code breaks its kind's contract (a tool or verifier missing, a verifier's
    answer of the wrong shape): the operation fails as an env_error saying why."""


class Host(Protocol):
    """What a sandbox worker lends the kinds (`SandboxHost` in worldsmith/runtime/sandbox/host.py).
    `env` and `episode` are the worker's records of a loaded environment and an open episode
    (`LoadedEnv`, `OpenEpisode` in worldsmith/runtime/sandbox/records.py)."""

    def run(self, fn: Callable[[], Any], *, episode: Any, files: tuple[str, ...]) -> tuple[Any, str]:
        """`fn()` run as generated code, confined: (its result, what it printed). A refusal or
        fault of the code ends the operation (tool_error or env_error)."""
        ...

    def module(self, code: CodeType, name: str, episode: Any) -> dict[str, Any]:
        """The namespace left by running `code` as module `name` of generated code."""
        ...

    def start_app(self, env: Any) -> Mapping[str, Any]:
        """The routes of `env`'s app by tool name (each with `schema()`), the app run once first."""
        ...

    def call_route(self, episode: Any, name: str, arguments: JsonObject) -> Any:
        """One request to the route of tool `name`: 4xx answers are refusals, 5xx answers faults."""
        ...

    def databases(self, episode: Any) -> AbstractContextManager[tuple[sqlite3.Connection, sqlite3.Connection]]:
        """Read-only connections to the episode's untouched and current databases, closed on exit."""
        ...

    def database_files(self, episode: Any) -> tuple[str, str]:
        """Paths of read-only files holding the episode's untouched and current databases."""
        ...


# -- tools --------------------------------------------------------------------------------------


class ToolsKind(ABC):
    """How an environment's tools are written and called; one instance per kind."""

    #: The manifest's `tools_kind` (None: native).
    name: ClassVar[str | None]
    #: Files a bundle of this kind is written from, and files derived from them when it is built.
    source_files: ClassVar[tuple[str, ...]]
    derived_files: ClassVar[tuple[str, ...]]
    #: Source files a bundle of any kind may have or not (bundles written before them stay valid).
    optional_files: ClassVar[tuple[str, ...]] = ("invariants.json",)
    #: The file whose code runs as the tools (error locations point into it).
    code_file: ClassVar[str]
    #: Whether the code runs only in workers that imported the web stack.
    web_stack: ClassVar[bool] = False
    #: Whether the code commits and rolls back on its own (its connection's commits then act on
    #: an inner savepoint, so the runtime can still undo a whole call).
    app_transactions: ClassVar[bool] = False

    @property
    def artifact_files(self) -> tuple[str, ...]:
        """Every file a bundle of this kind may have besides its manifest (the optional ones included)."""
        return self.source_files + self.optional_files + self.derived_files

    @property
    def derives_schemas(self) -> bool:
        """Whether tools.json is derived from the code (else it is a source, recorded from the running code)."""
        return "tools.json" in self.derived_files

    # -- parent side
    @abstractmethod
    def check_code(self, source: str) -> list[tuple[int, str]]:
        """The static policy check of the tools' code: `(line, problem)` for every violation."""

    @abstractmethod
    def code_fields(self, files: Mapping[str, bytes]) -> ToolsCode:
        """The fields of a worker's `load_env` request that carry the tools' code."""

    # -- worker side
    @abstractmethod
    def compile(self, header: ToolsCode) -> CodeType:
        """The tools' code from a `load_env` request, compiled."""

    @abstractmethod
    def open(self, host: Host, env: Any, episode: Any) -> dict[str, Tool]:
        """The episode's tools by name; EnvFault if a listed tool is missing."""

    def schemas(self, host: Host, env: Any) -> list[JsonObject] | None:
        """The tool schemas the running code declares, or None where they are derived from the source."""
        return None

    def build_shared(self, host: Host, env: Any) -> None:
        """Build what every episode of `env` shares, once, before any episode exists (under strict
        isolation, in the template every episode's process is forked from): nothing for most kinds."""
        return None


class NativeTools(ToolsKind):
    """Plain functions of tools.py: `tool(conn, **arguments)`; tools.json derived from their signatures."""

    name = None
    source_files = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")
    derived_files = ("tools.json", "world.db")
    code_file = "tools.py"

    def check_code(self, source: str) -> list[tuple[int, str]]:
        return check_source(source, "tools.py")

    def code_fields(self, files: Mapping[str, bytes]) -> ToolsCode:
        return {"tools": files["tools.py"].decode("utf-8")}

    def compile(self, header: ToolsCode) -> CodeType:
        return compile(header["tools"], "tools.py", "exec", dont_inherit=True)

    def open(self, host: Host, env: Any, episode: Any) -> dict[str, Tool]:
        """tools.py run afresh for the episode (no globals shared with another episode)."""
        namespace = host.module(env.code, "tools", episode)
        missing = [n for n in env.tool_names if not callable(namespace.get(n))]
        if missing:
            raise EnvFault(f"tools.py does not define {', '.join(missing)}")
        return {name: _bound(namespace[name], episode) for name in env.tool_names}


def _bound(function: Callable[..., Any], episode: Any) -> Tool:
    return lambda arguments: function(episode.conn, **arguments)


class AppTools(ToolsKind):
    """The routes of a FastAPI app (app.py, as written for the AgentWorldModel-1K release), one tool
    per operation_id; tools.json is recorded from them when the environment is imported."""

    name = "asgi"
    source_files = ("schema.sql", "seed.sql", "app.py", "tools.json", "tasks.jsonl", "verifiers.py")
    derived_files = ("world.db",)
    code_file = "app.py"
    web_stack = True
    app_transactions = True

    def check_code(self, source: str) -> list[tuple[int, str]]:
        return check_app_source(source)

    def code_fields(self, files: Mapping[str, bytes]) -> ToolsCode:
        return {"app": files["app.py"].decode("utf-8")}

    def compile(self, header: ToolsCode) -> CodeType:
        return compile_app(header["app"])

    def open(self, host: Host, env: Any, episode: Any) -> dict[str, Tool]:
        routes = host.start_app(env)
        missing = [n for n in env.tool_names if n not in routes]
        if missing:
            raise EnvFault(f"app.py has no route with operation_id {', '.join(missing)}")
        return {name: _routed(host, episode, name) for name in routes}

    def schemas(self, host: Host, env: Any) -> list[JsonObject] | None:
        return [route.schema() for route in host.start_app(env).values()]

    def build_shared(self, host: Host, env: Any) -> None:
        host.start_app(env)  # the app and its routes, built on a private copy of the world


def _routed(host: Host, episode: Any, name: str) -> Tool:
    return lambda arguments: host.call_route(episode, name, arguments)


# -- verifiers ----------------------------------------------------------------------------------


class VerifiersKind(ABC):
    """How an environment's verifiers are called and what their answers mean; one instance per kind."""

    #: The manifest's `verifiers_kind` (None: native).
    name: ClassVar[str | None]
    #: How many parameters a verifier may take, and the signature as the loader tells it.
    arities: ClassVar[tuple[int, ...]]
    signature: ClassVar[str]

    def verifier(self, host: Host, episode: Any, name: str) -> Callable[..., Any]:
        """Verifier `name` of verifiers.py, run afresh for the call; EnvFault if it is missing."""
        verifier: object = host.module(episode.env.verifiers_code, "verifiers", episode).get(name)
        if not callable(verifier):
            raise EnvFault(f"verifiers.py does not define {name!r}")
        return verifier

    @abstractmethod
    def verify(self, host: Host, episode: Any, name: str, answer: str) -> tuple[Verdict, JsonObject]:
        """Run verifier `name` on the episode's untouched and current databases and the agent's final
        `answer`: its verdict and the evidence a judge reads. EnvFault for an answer of the wrong shape."""


class NativeVerifiers(VerifiersKind):
    """`verify(initial, final, answer) -> {"status": complete|partial|incomplete, "evidence": {...}}`
    on read-only connections to the untouched and the current database."""

    name = None
    arities = (3,)
    signature = "(initial, final, answer)"

    def verify(self, host: Host, episode: Any, name: str, answer: str) -> tuple[Verdict, JsonObject]:
        with host.databases(episode) as (initial, final):
            verifier = self.verifier(host, episode, name)
            text, _ = host.run(
                lambda: json_text(verifier(initial, final, answer)), episode=episode, files=("verifiers.py",)
            )
        result = json.loads(text)
        if not isinstance(result, dict) or result.get("status") not in VERIFIER_VERDICTS:
            raise EnvFault(
                f"verifier {name} returned {text[:200]}; "
                "expected {'status': complete|partial|incomplete, 'evidence': {...}}"
            )
        evidence = result.get("evidence") or {}
        if not isinstance(evidence, dict):
            raise EnvFault(f"verifier {name} returned evidence that is not a dict")
        return Verdict(result["status"]), evidence


class ReleaseVerifiers(VerifiersKind):
    """A verifier of the AgentWorldModel-1K release: called with the paths of read-only copies of the
    untouched and the current database (in the episode's directory, its only readable files); its
    whole answer is the evidence, and it says complete or not (never partial)."""

    def verify(self, host: Host, episode: Any, name: str, answer: str) -> tuple[Verdict, JsonObject]:
        verifier = self.verifier(host, episode, name)
        paths = host.database_files(episode)
        arguments = (*paths, answer) if self.takes_answer(verifier) else paths
        text, _ = host.run(lambda: json_text(verifier(*arguments)), episode=episode, files=("verifiers.py",))
        result = json.loads(text)
        if not isinstance(result, dict):
            raise EnvFault(f"verifier returned {text[:200]}; expected a dict")
        return (Verdict.complete if self.passed(result) else Verdict.incomplete), result

    def takes_answer(self, verifier: Callable[..., Any]) -> bool:
        """Whether `verifier` is called with the agent's final answer too."""
        return False

    @abstractmethod
    def passed(self, result: JsonObject) -> bool:
        """Whether the verifier's answer says the task is complete."""


class ReleaseCodeVerifiers(ReleaseVerifiers):
    """The release's code mode: `verify_task_completion(initial_db_path, final_db_path, final_answer=None)
    -> {"result": "complete" | "others", ...}`."""

    name = "awm-code"
    arities = (2, 3)
    signature = "(initial_db_path, final_db_path, final_answer=None)"

    def takes_answer(self, verifier: Callable[..., Any]) -> bool:
        code = verifier.__code__
        return code.co_argcount + code.co_kwonlyargcount >= 3

    def passed(self, result: JsonObject) -> bool:
        return result.get("result") == "complete"


class ReleaseSqlVerifiers(ReleaseVerifiers):
    """The release's sql mode: `verify_task(initial_db_path, final_db_path) -> {..., "all_checks_passed": bool}`,
    evidence for a judge; a verdict of its own only where it says all its checks passed."""

    name = "awm-sql"
    arities = (2,)
    signature = "(initial_db_path, final_db_path)"

    def passed(self, result: JsonObject) -> bool:
        return result.get("all_checks_passed") is True


NATIVE_TOOLS = NativeTools()
APP_TOOLS = AppTools()
NATIVE_VERIFIERS = NativeVerifiers()
RELEASE_CODE_VERIFIERS = ReleaseCodeVerifiers()
RELEASE_SQL_VERIFIERS = ReleaseSqlVerifiers()
#: Every kind by the name a manifest gives it.
TOOLS_KINDS: dict[str | None, ToolsKind] = {kind.name: kind for kind in (NATIVE_TOOLS, APP_TOOLS)}
VERIFIERS_KINDS: dict[str | None, VerifiersKind] = {
    kind.name: kind for kind in (NATIVE_VERIFIERS, RELEASE_CODE_VERIFIERS, RELEASE_SQL_VERIFIERS)
}
