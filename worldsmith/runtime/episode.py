"""Episodes: one agent attempt at one task on a private copy of an environment's database.

`Episode` is what every world offers an agent, real or simulated (worldsmith/worldmodel/simulated.py).
The real one: `Runtime` owns the sandbox worker pool; `Runtime.open_episode(bundle, task)` returns a
`SandboxEpisode` whose database lives with a worker (strict isolation: a file served by the
episode's own forked process; fast: in the worker's memory; made from `world.db` bytes, so a reset
is a copy). The parent keeps each episode's journal of successful writing calls: if its
worker dies or is retired (because some episode's code broke a limit), the episode is
reopened on a fresh worker and the journal replayed, so other episodes go on untouched. A call that
takes its world past a total (runtime/totals.py) is undone the same way: its episode reopened from its
base and its journal replayed, the call an env_error naming the limit.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
import shutil
import threading
import uuid
from pathlib import Path
from typing import Protocol, Self

from pydantic import ValidationError

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.kinds import APP_TOOLS, ToolsKind
from worldsmith.bundle.readquery import QueryOutcome, outcomes_from_json
from worldsmith.jsonvalue import JsonObject
from worldsmith.models.bundle import TaskSpec
from worldsmith.models.results import AppRoutes, DbDiff, ToolResult, VerifierResult
from worldsmith.models.verdict import Verdict
from worldsmith.runtime.arguments import accepts
from worldsmith.runtime.errors import RuntimeFault, WorkerLost
from worldsmith.runtime.limits import SandboxLimits
from worldsmith.runtime.pool import WorkerPool
from worldsmith.runtime.sandbox.messages import (
    CallRequest,
    EpisodeRequest,
    LoadEnvRequest,
    OpenRequest,
    QueryRequest,
    Reply,
)
from worldsmith.runtime.scratch import new_scratch
from worldsmith.runtime.worker_handle import SandboxWorker
from worldsmith.settings import get_settings
from worldsmith.toolschema import ToolSchemaJson

#: The fields of a worker's reply that make a `ToolResult` (the rest is the channel's own; the value
#: comes as the reply's blob).
_RESULT_FIELDS = frozenset(ToolResult.model_fields) - {"value"}
#: Requests after which what the episode holds is read again (a call's own reading may refuse it: `call_tool`).
_MEASURED_AFTER = frozenset({"snapshot", "diff", "verify", "restore"})


class Episode(Protocol):
    """One isolated attempt at a task (`task` None: free play) on a world, real or simulated: what
    agents, probes and the MCP gateway call. Closing it frees its database; it is a context manager."""

    id: str
    bundle: Bundle
    task: TaskSpec | None

    def tools(self) -> list[ToolSchemaJson]:
        """The tools' JSON Schemas (`tools.json`)."""
        ...

    def call_tool(self, name: str, arguments: JsonObject | None = None) -> ToolResult:
        """Call tool `name`; bad arguments and refusals come back as `tool_error`, faults as `env_error`."""
        ...

    def snapshot(self) -> bytes:
        """The episode's database, serialized."""
        ...

    def diff(self, before: bytes, after: bytes | None = None) -> DbDiff:
        """Rows inserted, updated and deleted per table from snapshot `before` to `after` (default: now)."""
        ...

    def verify(self, answer: str = "") -> VerifierResult:
        """The task's verifier on the untouched and the current database plus the final `answer`."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Self: ...

    def __exit__(self, *exc: object) -> None: ...


def tool_schemas(bundle: Bundle) -> list[ToolSchemaJson]:
    """The bundle's tools as JSON (`tools.json`), copies an episode's caller may keep."""
    return [
        ToolSchemaJson(name=t.name, description=t.description, parameters=copy.deepcopy(t.parameters))
        for t in bundle.tools
    ]


def checked_call(bundle: Bundle, name: str, arguments: JsonObject | None) -> tuple[JsonObject, ToolResult | None]:
    """A call's arguments ({} for None) and, when the call is refused before any code runs (an
    unknown tool, arguments that break its schema), the `tool_error` that answers it."""
    arguments = {} if arguments is None else arguments
    validator = bundle.validators.get(name)
    if validator is not None and accepts(validator, arguments):  # surely valid, told in microseconds
        return arguments, None
    refused = bundle.argument_error(name, arguments)
    return arguments, (ToolResult(status="tool_error", error=refused) if refused else None)


class Runtime:
    """Runs bundles' tools and verifiers in a pool of sandbox workers."""

    name = "real"

    def __init__(self, limits: SandboxLimits | None = None, workers: int | None = None, scratch: Path | None = None):
        settings = get_settings()
        self.limits = limits or SandboxLimits.from_settings(settings)
        # Scratch space must be reachable by the workers' unprivileged uid: a fresh directory
        # in the system temp dir (sticky, world-traversable) unless one is given; those that killed
        # processes left there are swept first (worldsmith/runtime/scratch.py).
        self._own_scratch = scratch is None
        root = scratch or new_scratch()
        self.pool = WorkerPool(self.limits, workers or settings.worker_count(), root.resolve())
        self._app_pool: WorkerPool | None = (
            None  # workers with the web stack, started when an ASGI environment needs one
        )
        self._episodes: dict[str, SandboxEpisode] = {}
        self._lock = threading.Lock()

    def pool_for(self, bundle: Bundle) -> WorkerPool:
        """The pool whose workers can run `bundle`: stdlib-only workers, or where its tools kind needs
        the web stack (an ASGI environment) workers that have it."""
        return self.pool_for_kind(bundle.tools_kind)

    def pool_for_kind(self, tools_kind: ToolsKind) -> WorkerPool:
        if not tools_kind.web_stack:
            return self.pool
        with self._lock:
            if self._app_pool is None:
                self._app_pool = WorkerPool(
                    self.limits, self.pool.size, self.pool.scratch_root / "asgi", frameworks=True
                )
            return self._app_pool

    def open_episode(
        self, bundle: Bundle, task: str | TaskSpec | None = None, *, clock_skew_s: float = 0.0
    ) -> SandboxEpisode:
        """A new isolated episode of `bundle`, for `task` (an id or spec; None for free play).
        `clock_skew_s` shifts every real-time source its code can read past the world's frozen clock
        (worldsmith/runtime/sandbox/worldclock.py): the determinism probe's second replay."""
        spec = bundle.task(task) if isinstance(task, str) else task
        episode = SandboxEpisode(self, bundle, spec, clock_skew_s=clock_skew_s)
        with self._lock:
            self._episodes[episode.id] = episode
        return episode

    def _forget(self, episode: SandboxEpisode) -> None:
        with self._lock:
            self._episodes.pop(episode.id, None)

    @property
    def open_episodes(self) -> int:
        return len(self._episodes)

    def describe_app(self, app_source: str, world: bytes) -> AppRoutes:
        """The tools of an ASGI app (one per route, by operation_id), read by running the app in a
        sandbox worker on a private copy of `world`; if it fails, the app's error and the sandbox limit
        it broke."""
        pool = self.pool_for_kind(APP_TOOLS)
        key = "describe-" + uuid.uuid4().hex
        worker = pool.acquire(key)  # a worker of its own, retired after: the app's code ran there
        try:
            load: LoadEnvRequest = {
                "op": "load_env",
                "env": key,
                "tools_kind": APP_TOOLS.name,
                "app": app_source,
                "verifiers": "",
                "tool_names": [],
            }
            reply, _ = worker.request(load, [world], timeout=60)
            if reply["status"] == "ok":
                reply, _ = worker.request(
                    {"op": "routes", "env": key}, timeout=self.limits.call_timeout_s * 4 + self.limits.grace_s
                )
            if reply["status"] != "ok":
                return AppRoutes(
                    error=f"the app does not load: {reply.get('error')}",
                    limit=reply.get("limit"),
                    refused_module=reply.get("refused_module"),
                )
            return AppRoutes(tools=reply["tools"], stand_in_reads=reply.get("stand_in_reads", []))
        finally:
            pool.release(worker, retire=True)

    def layers(self) -> dict[str, str]:
        """Which confinement layers the workers run with (docs/security.md)."""
        return self.pool.layers()

    def close(self) -> None:
        for episode in list(self._episodes.values()):
            episode.close()
        self.pool.close()
        if self._app_pool is not None:
            self._app_pool.close()
        if self._own_scratch:
            shutil.rmtree(self.pool.scratch_root, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxEpisode:
    """One isolated episode of a real world, its database in a sandbox worker (an `Episode`).
    Thread-safe: operations on one episode run one at a time."""

    def __init__(self, runtime: Runtime, bundle: Bundle, task: TaskSpec | None, *, clock_skew_s: float = 0.0):
        self.runtime = runtime
        self.bundle = bundle
        self.task = task
        self.clock_skew_s = clock_skew_s  # sent with every request (`skew_s`)
        self.id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._journal: list[tuple[str, JsonObject, int]] = []  # (tool, arguments, random seed)
        self._calls = 0
        self._base: bytes | None = None  # database the journal starts from; None = world.db
        self._broken: str | None = None
        self._closed = False
        self.relocations = 0
        self._pool = runtime.pool_for(bundle)
        self._worker: SandboxWorker = self._place()

    # -- placement and recovery ----------------------------------------------------------
    def _place(self) -> SandboxWorker:
        """Open this episode on a worker and replay its journal there."""
        pool = self._pool
        while True:
            worker = pool.acquire(self.bundle.runtime_key)
            try:
                pool.ensure_env(worker, self.bundle)
                request: OpenRequest = {
                    "op": "open",
                    "episode": self.id,
                    "env": self.bundle.runtime_key,
                    "skew_s": self.clock_skew_s,
                }
                if self._base is None and not self._journal:  # a spare's process, if any, handed over with the reply
                    request["direct"] = True
                reply, _ = worker.request(
                    request, [self._base] if self._base is not None else [], timeout=self._timeout()
                )
                if reply["status"] != "ok":
                    pool.release(worker)
                    raise RuntimeFault(f"opening an episode of {self.bundle.env_id} failed: {reply.get('error')}")
                worker.totals.opened(self.id, reply.get("area"), len(self.bundle.world))
                worker.totals.process(self.id, worker.channel_pid(self.id))  # a spare's, handed over at open
                for tool, arguments, seed in self._journal:
                    call: CallRequest = {
                        "op": "call",
                        "episode": self.id,
                        "tool": tool,
                        "arguments": arguments,
                        "seed": seed,
                        "skew_s": self.clock_skew_s,
                    }
                    replayed, _ = worker.request(call, timeout=self._timeout())
                    if replayed["status"] != "ok":
                        self._broken = (
                            f"episode state lost: replaying {tool} on a new worker failed ({replayed.get('error')})"
                        )
                        break
                worker.totals.measure(self.id, call=False)
                return worker
            except WorkerLost:
                pool.release(worker)
                continue  # that worker died while we set up; take another

    def _timeout(self, calls: int = 1) -> float:
        limits = self.runtime.limits
        return calls * limits.call_timeout_s + limits.grace_s

    def _request(
        self, request: EpisodeRequest, blobs: list[bytes] | tuple[bytes, ...] = (), *, calls: int = 1
    ) -> tuple[Reply, list[bytes]]:
        """Send a request for this episode (with its clock skew), moving it to a fresh worker if its worker is gone.

        The effects of a request lost in flight died with its worker, so it may run again: once,
        if the worker crashed (it may have been killed from outside); never after a timeout
        (the request itself was stuck). Otherwise `WorkerLost` propagates, after the move.
        """
        if self._closed:
            raise RuntimeFault(f"episode {self.id} is closed")
        request = request.copy()
        request["skew_s"] = self.clock_skew_s
        crashes = 0
        for _ in range(4):
            try:
                answered = self._worker.episode_request(self.id, request, blobs, timeout=self._timeout(calls))
                if request["op"] in _MEASURED_AFTER:
                    self._worker.totals.measure(self.id, call=False)
                return answered
            except WorkerLost as lost:
                self._relocate()
                if not lost.in_flight:
                    continue
                if lost.limit == "crash" and crashes == 0:
                    crashes += 1
                    continue
                raise
        raise RuntimeFault("sandbox workers keep dying; giving up")

    def _invalid_reply(self, problem: ValidationError | str) -> str:
        """A well-framed reply whose content breaks the reply contract (generated code can reach the
        worker's encoder, e.g. through a class attribute of `json`): the worker is not trusted again.
        It is killed and this episode moves to a fresh one; returns the reason for the env_error."""
        if isinstance(problem, ValidationError):
            errors = problem.errors()
            where = ".".join(str(part) for part in errors[0]["loc"]) if errors else ""
            message = errors[0]["msg"] if errors else str(problem)
            problem = f"{where or 'reply'}: {message}"
        reason = f"sandbox limit protocol: the worker sent an invalid reply ({problem}); worker killed and replaced"
        self._worker.kill(reason)
        self._relocate()
        return reason

    def _relocate(self) -> None:
        self._worker.totals.closed(self.id)
        self._pool.release(self._worker)
        self.relocations += 1
        self._worker = self._place()

    def _undo(self) -> None:
        """Undo a call its world's totals refused (runtime/totals.py): the episode's process stopped, its
        database and file area dropped, and the episode opened afresh from its base with its journal
        replayed, as a move to a fresh worker does (the refused call is not in the journal)."""
        try:
            self._worker.episode_request(self.id, {"op": "close", "episode": self.id}, timeout=self._timeout())
        except WorkerLost:
            pass
        self._relocate()

    def _next_seed(self) -> int:
        """The seed of `random` for this episode's next call: reset before every call (no call sees
        what another left), distinct per call, recorded in the journal so a replay draws the same."""
        self._calls += 1
        digest = hashlib.blake2b(f"{self.id}:{self._calls}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big")

    # -- API -----------------------------------------------------------------------------
    def tools(self) -> list[ToolSchemaJson]:
        """The tools' JSON Schemas (`tools.json`)."""
        return tool_schemas(self.bundle)

    def call_tool(self, name: str, arguments: JsonObject | None = None) -> ToolResult:
        """Call tool `name`; bad arguments and refusals come back as `tool_error`, faults as `env_error`."""
        result, text = self.call_tool_text(name, arguments)
        if text is None:
            return result
        try:
            result.value = json.loads(text)
        except (ValueError, RecursionError) as exc:  # only a forged reply carries text json_text did not write
            problem = f"the value is not JSON: {type(exc).__name__}"
            return ToolResult(status="env_error", error=self._invalid_reply(problem), limit="protocol")
        return result

    def call_tool_text(self, name: str, arguments: JsonObject | None = None) -> tuple[ToolResult, bytes | None]:
        """Call tool `name` as `call_tool` does, its value left as the JSON text the sandbox sent (at most
        `MAX_RESULT_BYTES`, not checked here: a reply can be forged): the result, its `value` None, and
        the value's text when the call succeeded (None otherwise). What the MCP gateway answers from,
        without decoding a large value into objects (serving/mcp_results.py)."""
        arguments, refusal = checked_call(self.bundle, name, arguments)
        if refusal is not None:
            return refusal, None
        with self._lock:
            if self._broken:
                return ToolResult(status="env_error", error=self._broken, limit="crash"), None
            seed = self._next_seed()
            try:
                reply, blobs = self._request(
                    {"op": "call", "episode": self.id, "tool": name, "arguments": arguments, "seed": seed}
                )
            except WorkerLost as lost:
                return ToolResult(status="env_error", error=lost.reason, limit=lost.limit), None
            over = self._worker.totals.measure(self.id, call=True)
            try:
                result = ToolResult.model_validate({k: v for k, v in reply.items() if k in _RESULT_FIELDS})
            except ValidationError as exc:
                return ToolResult(status="env_error", error=self._invalid_reply(exc), limit="protocol"), None
            if over is not None:  # what it left or took past its world's limits: undone, the others go on
                self._undo()  # a limit the call's own answer names (it broke it first) is the answer
                if result.limit:
                    return result, None
                return ToolResult(status="env_error", error=over.error, limit=over.limit), None
            if result.ok and len(blobs) != 1:
                problem = f"a result with {len(blobs)} values"
                return ToolResult(status="env_error", error=self._invalid_reply(problem), limit="protocol"), None
            if result.ok and result.changed:
                self._journal.append((name, arguments, seed))
            return result, blobs[0] if result.ok else None

    def snapshot(self) -> bytes:
        """The episode's database, serialized."""
        with self._lock:
            reply, blobs = self._request({"op": "snapshot", "episode": self.id})
            self._raise_unless_ok(reply, "snapshot")
            return blobs[0]

    def restore(self, data: bytes | None = None) -> None:
        """Replace the episode's database by `data` (a snapshot), or by the pristine world (reset)."""
        with self._lock:
            reply, _ = self._request({"op": "restore", "episode": self.id}, [data] if data is not None else [])
            self._raise_unless_ok(reply, "restore")
            self._base = data
            self._journal = []
            self._broken = None

    def reset(self) -> None:
        """Back to the untouched initial database: a copy of `world.db` in the worker."""
        self.restore(None)

    def diff(self, before: bytes, after: bytes | None = None) -> DbDiff:
        """Rows inserted, updated and deleted per table from snapshot `before` to `after` (default: now)."""
        with self._lock:
            reply, blobs = self._request(
                {"op": "diff", "episode": self.id}, [before] if after is None else [before, after], calls=10
            )
            self._raise_unless_ok(reply, "diff")
            try:
                return DbDiff.model_validate({"tables": json.loads(blobs[0])})
            except (IndexError, ValueError, RecursionError) as exc:  # ValidationError is a ValueError
                raise RuntimeFault(f"diff failed: {self._invalid_reply(f'no diff: {type(exc).__name__}')}") from None

    def query(self, queries: list[str], max_rows: int, query_s: float, total_s: float) -> list[QueryOutcome]:
        """Run read-only `queries` (generated: a world's invariants) on a copy of the episode's database in
        its worker (`bundle/readquery.py`: hardened read-only, each within `query_s` seconds and all within
        `total_s`, at most `max_rows` rows of each read): their outcomes, in order."""
        request: QueryRequest = {
            "op": "query",
            "episode": self.id,
            "queries": queries,
            "max_rows": max_rows,
            "query_s": query_s,
            "total_s": total_s,
        }
        with self._lock:
            reply, blobs = self._request(request, calls=max(1, math.ceil(total_s / self.runtime.limits.call_timeout_s)))
            self._raise_unless_ok(reply, "query")
            try:
                outcomes = outcomes_from_json(blobs[0])  # checked: a reply can be forged
            except (IndexError, ValueError, RecursionError) as exc:  # ValidationError is a ValueError
                raise RuntimeFault(
                    f"query failed: {self._invalid_reply(f'no outcomes: {type(exc).__name__}')}"
                ) from None
            if len(outcomes) != len(queries):
                raise RuntimeFault(f"query failed: {self._invalid_reply(f'{len(outcomes)} outcomes')}")
            return outcomes

    def verify(self, answer: str = "") -> VerifierResult:
        """Run the task's verifier on the untouched and the current database plus the final `answer`."""
        if self.task is None:
            raise RuntimeFault("this episode has no task to verify")
        with self._lock:
            try:
                reply, blobs = self._request(
                    {"op": "verify", "episode": self.id, "verifier": self.task.verifier, "answer": answer}, calls=2
                )
            except WorkerLost as lost:
                return VerifierResult(status=Verdict.env_error, error=lost.reason, limit=lost.limit)
            try:
                if reply.get("status") != "ok":
                    return VerifierResult(
                        status=Verdict.env_error,
                        error=reply.get("error"),
                        limit=reply.get("limit"),
                        refused_module=reply.get("refused_module"),
                    )
                evidence = json.loads(blobs[0]) if blobs else None
                return VerifierResult.model_validate({"status": reply.get("verdict"), "evidence": evidence or {}})
            except ValidationError as exc:
                return VerifierResult(status=Verdict.env_error, error=self._invalid_reply(exc), limit="protocol")
            except (ValueError, RecursionError) as exc:  # only a forged reply carries evidence json_text did not write
                problem = f"the evidence is not JSON: {type(exc).__name__}"
                return VerifierResult(status=Verdict.env_error, error=self._invalid_reply(problem), limit="protocol")

    @staticmethod
    def _raise_unless_ok(reply: Reply, what: str) -> None:
        if reply["status"] != "ok":
            raise RuntimeFault(f"{what} failed: {reply.get('error')}")

    def close(self) -> None:
        """Free the episode's database in its worker (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._worker.alive:
                    self._worker.episode_request(self.id, {"op": "close", "episode": self.id}, timeout=self._timeout())
            except WorkerLost:
                pass
            finally:
                self._worker.totals.closed(self.id)
                self._pool.release(self._worker)
                self.runtime._forget(self)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
