"""The worker's operations: one `op_<name>` method per request op, on its environments and episodes. Stdlib only.

`Operations` holds what a worker has loaded (`LoadedEnv` by key) and opened (`OpenEpisode` by id) and
answers each request (its op's request type of `messages`) with its op's part of the reply (some
with blobs), or raises `Failure`. How an environment's tools
open and how its verifiers run is its kinds' business (`bundle/kinds.py`): they get the worker's
`SandboxHost`. Under fast isolation the operations run here, episodes' databases in memory; under
strict isolation the worker keeps only records and files, and the requests of `worker.RUN_OPS` are
served by processes forked from it (`ForkedProcesses`), where these same operations run on the
episode's database file. Those processes are forked by the worker's template (`template.py`),
forked when the environment is loaded, before any episode's request.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import signal
import sqlite3
import sys
from collections.abc import Callable

from worldsmith.bundle.jsonvalues import json_text
from worldsmith.bundle.kinds import TOOLS_KINDS, VERIFIERS_KINDS, Tool
from worldsmith.bundle.readquery import run_read_queries
from worldsmith.bundle.sqlscript import deserialize, restore, snapshot
from worldsmith.jsonvalue import JsonObject
from worldsmith.runtime.sandbox import dbdiff, episodedb, guard, standin, worldclock
from worldsmith.runtime.sandbox.episodedb import refuse_transaction_control, write_db
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.host import SandboxHost, app_module_name
from worldsmith.runtime.sandbox.messages import (
    CallReply,
    CallRequest,
    CheckEnvRequest,
    CloseRequest,
    DiffRequest,
    EpisodeRequest,
    FirstPagesRequest,
    LoadEnvReply,
    LoadEnvRequest,
    OpenReply,
    OpenRequest,
    PingReply,
    PingRequest,
    QueryRequest,
    ReapReply,
    ReapRequest,
    Request,
    RestoreRequest,
    RoutesReply,
    RoutesRequest,
    SnapshotRequest,
    StatusOnly,
    UnloadEnvRequest,
    VerifyReply,
    VerifyRequest,
    WorkerConfig,
    env_of,
    episode_of,
)
from worldsmith.runtime.sandbox.processes import ForkedProcesses
from worldsmith.runtime.sandbox.protocol import MAX_RESULT_BYTES, truncated
from worldsmith.runtime.sandbox.records import LoadedEnv, OpenEpisode

MAX_EVIDENCE_BYTES = 1024 * 1024  # a verifier's evidence as JSON, replaced by a marked excerpt beyond this


def _capped_evidence(evidence: JsonObject) -> bytes:
    """A verifier's evidence as sent back, as JSON: whole up to MAX_EVIDENCE_BYTES, else a marked excerpt."""
    try:
        text = json_text(evidence)
    except (ValueError, TypeError, RecursionError) as exc:
        raise Failure("env_error", f"verifier evidence cannot be sent: {type(exc).__name__}: {exc}") from None
    if len(text) > MAX_EVIDENCE_BYTES:
        text = json.dumps({"truncated": truncated(text, MAX_EVIDENCE_BYTES)})
    return text.encode()


class Operations:
    """A worker's loaded environments and open episodes, and the operations requests perform on them."""

    def __init__(
        self,
        config: WorkerConfig,
        host: SandboxHost,
        processes: ForkedProcesses,
        *,
        strict: bool,
        start_template: Callable[[], None] = lambda: None,
    ):
        self.config = config
        self.host = host  # what the environments' kinds run generated code through
        self.processes = processes  # strict isolation: the processes forked for episodes and requests
        self.strict = strict
        self._start_template = start_template  # strict isolation: fork the template (`worker.Worker`)
        self.scratch: str = config["scratch"]
        self.envs: dict[str, LoadedEnv] = {}
        self.episodes: dict[str, OpenEpisode] = {}

    def request_env(self, request: Request) -> LoadedEnv | None:
        """The loaded environment a request is for (through its episode, else its `env`), if any."""
        episode_id, env_key = episode_of(request), env_of(request)
        episode = self.episodes.get(episode_id) if episode_id is not None else None
        if episode is not None:
            return episode.env
        return self.envs.get(env_key) if env_key is not None else None

    # -- environments ----------------------------------------------------------------------
    def op_load_env(self, request: LoadEnvRequest, blobs: list[bytes]) -> LoadEnvReply:
        kind = TOOLS_KINDS[request.get("tools_kind")]
        if kind.web_stack and not self.config.get("frameworks"):
            raise Failure("env_error", "an ASGI environment needs a worker with the web stack")
        if self.strict and request["env"] in self.envs:  # loaded already (the parent's threads may race to it)
            return {}
        if self.strict and self.envs:  # its template holds the one it loaded first
            raise Failure("env_error", "a worker under strict isolation loads one environment")
        env = self.envs[request["env"]] = LoadedEnv(
            key=request["env"],
            world=blobs[0],
            tools_kind=kind,
            code=kind.compile(request),
            verifiers_kind=VERIFIERS_KINDS[request.get("verifiers_kind")],
            verifiers_code=compile(request["verifiers"], "verifiers.py", "exec", dont_inherit=True),
            tool_names=list(request["tool_names"]),
            clock=request.get("clock"),
        )
        gc.freeze()  # what forked processes share stays untouched by their collections (fewer page copies)
        if self.strict:  # every process from now on is forked by the template: a copy of this, clean
            try:
                self._start_template()
            except BaseException:
                del self.envs[env.key]  # not loaded: nothing could serve it
                raise
        if self.strict and request.get("check", True):  # the tools load? (once, in a process of its own)
            check: CheckEnvRequest = {"op": "check_env", "env": env.key}
            if "timeout_s" in request:
                check["timeout_s"] = request["timeout_s"]
            reply, _ = self.processes.serve(check, [], self.episodes)
            if reply.get("status") != "ok":
                env.load_error = str(reply.get("error"))
        spares = int(self.config.get("spare_processes", 0)) > 0
        if self.strict and request.get("probe") and kind.web_stack and spares and env.load_error is None:
            pid = self.processes.start_probe(env.key, self._new_directory())  # the parent reads its pages
            if pid is not None:
                return {"probe_pid": pid}
        return {}

    def op_first_pages(self, request: FirstPagesRequest, blobs: list[bytes]) -> StatusOnly:
        """The pages the parent read from the probe (`firstpages`): spares make them their own ahead.
        Pages for no pending probe (it was ended by another request: `Worker.handle`) are refused."""
        if self.processes.prober is None or request["env"] not in self.envs:
            raise Failure("env_error", "no probe of this environment waits for its pages")
        try:
            self.processes.end_probe(blobs[0] if blobs else b"")
        except ValueError as exc:
            raise Failure("env_error", str(exc)) from None
        return {}

    def build_shared(self) -> None:
        """Strict isolation, in the template, before it forks anything: build once what every episode
        of the loaded environment shares (an ASGI environment's app: `ToolsKind.build_shared`), so
        that no episode's process builds it again. The code runs under the guard as anywhere; if it
        fails or breaks a limit, what it built is dropped and each process builds it (and reports
        why it does not build) as before."""
        handlers = {number: signal.getsignal(number) for number in signal.valid_signals()}
        callbacks = list(gc.callbacks)
        for env in self.envs.values():
            before = len(guard.GUARD.violations)
            try:
                worldclock.set_clock(env.clock, 0.0)  # module-level clock reads: the world's, no episode's skew
                env.tools_kind.build_shared(self.host, env)
                if self.config.get("stand_in_reads", True):  # an app's first requests, made here if harmless
                    env.stand_in_reads = standin.keep_stand_in_reads(self.host, env)
            except Exception:  # noqa: BLE001 - each process that builds it again reports it
                env.app, env.routes = None, {}
                sys.modules.pop(app_module_name(env.key), None)
                del guard.GUARD.violations[before:]  # the processes forked from here start clean
        # what code past the guard could have left to run here later, undone where Python can undo it
        for number, handler in handlers.items():
            if handler is not None and signal.getsignal(number) is not handler:
                signal.signal(number, handler)
        gc.callbacks[:] = callbacks
        sys.settrace(None)
        sys.setprofile(None)
        gc.freeze()  # what was built stays out of the processes' collections (their pages shared)

    def op_check_env(self, request: CheckEnvRequest, blobs: list[bytes]) -> StatusOnly:
        """Open the environment's tools once on a private copy of its world (strict isolation's load check)."""
        env = self.envs[request["env"]]
        conn = episodedb.memory_connection(env.world, env.tools_kind, env.clock)
        env.tools_kind.open(
            self.host, env, OpenEpisode(id="check", env=env, conn=conn, directory=self._new_directory())
        )
        return {}

    def refill_spares(self, waiting: Callable[[], bool], *, settle: bool = False) -> None:
        """Strict isolation: spares for the loaded environment's next episodes (`ForkedProcesses.refill`),
        if it loaded cleanly, until `waiting()` says a request waits (`settle`: all, each ready)."""
        envs = list(self.envs.values())
        if len(envs) == 1 and envs[0].load_error is None:
            self.processes.refill(envs[0].key, self._new_directory, waiting, settle=settle)

    def op_unload_env(self, request: UnloadEnvRequest, blobs: list[bytes]) -> StatusOnly:
        self.processes.end_probe()
        self.processes.discard_spares()
        env = self.envs.pop(request["env"], None)
        for episode in [e for e in self.episodes.values() if e.env is env]:
            self.processes.stop_episode_process(episode.id)
        if env is not None and env.app is not None:
            sys.modules.pop(app_module_name(env.key), None)
        return {}

    def op_routes(self, request: RoutesRequest, blobs: list[bytes]) -> RoutesReply:
        """The tools of an ASGI environment's app: one JSON schema per route."""
        env = self.envs.get(request["env"])
        schemas = env.tools_kind.schemas(self.host, env) if env is not None else None
        if env is None or schemas is None:
            raise Failure("env_error", f"ASGI environment {request['env']} is not loaded in this worker")
        return {"tools": schemas, "stand_in_reads": list(env.stand_in_reads)}

    # -- episodes --------------------------------------------------------------------------
    def _new_directory(self) -> str:
        """A fresh name in the scratch directory for an episode's file area (and database): 128 random
        bits, so that no episode can guess another's (nor learn it from its id)."""
        return os.path.join(self.scratch, os.urandom(16).hex())

    def open_database(self, episode: OpenEpisode) -> None:
        """Strict isolation, in a process forked for one of `episode`'s requests, before it confines
        itself to the episode's file area: open the episode's database file (made from the world at
        its first use) and its journal, which no code this process runs can then reach by path; if
        it does not open, keep why (the request's answer)."""
        env = episode.env
        os.makedirs(episode.directory, exist_ok=True)
        try:
            episode.conn = episodedb.file_connection(episode.db_path, env.world, env.tools_kind, env.clock)
        except (sqlite3.Error, OSError) as exc:
            episode.open_error = f"the episode's database does not open: {type(exc).__name__}: {exc}"

    def _episode(self, request: EpisodeRequest) -> OpenEpisode:
        try:
            episode = self.episodes[request["episode"]]
        except KeyError:
            raise Failure("env_error", f"episode {request['episode']} is not open in this worker") from None
        if episode.conn is None:  # strict isolation: opened (or not) by `open_database` in this process
            raise Failure("env_error", episode.open_error or f"episode {episode.id}'s database is not open here")
        return episode

    def _tools(self, episode: OpenEpisode) -> dict[str, Tool]:
        if episode.tools is None:
            episode.tools = episode.env.tools_kind.open(self.host, episode.env, episode)
        return episode.tools

    def op_open(self, request: OpenRequest, blobs: list[bytes]) -> OpenReply:
        env = self.envs.get(request["env"])
        if env is None:
            raise Failure("env_error", f"environment {request['env']} is not loaded in this worker")
        # The episode's file area (`OpenEpisode`): the only place its code may open files; created by the
        # runtime when it puts files there (verifiers' database files) or confines a process to it;
        # removed with the episode, as is its database file (strict isolation).
        if self.strict:
            if env.load_error is not None:
                raise Failure("env_error", env.load_error)
            # from the world: a spare's directory (its process started, its database open), else a fresh one
            spare = None if blobs else self.processes.claim(request["episode"], request.get("skew_s"))
            directory = spare or self._new_directory()
            episode = OpenEpisode(id=request["episode"], env=env, conn=None, directory=directory)
            if blobs:
                write_db(episode.db_path, blobs[0])
            self.episodes[episode.id] = episode
            pid = self.processes.hand_over_fresh(episode.id) if spare and request.get("direct") is True else None
            if pid is not None:  # its first call goes to the process straight, not through this worker
                return {"area": os.path.basename(directory), "channel": True, "pid": pid}
            return {"area": os.path.basename(directory)}
        directory = self._new_directory()
        conn = episodedb.memory_connection(blobs[0] if blobs else env.world, env.tools_kind, env.clock)
        episode = OpenEpisode(id=request["episode"], env=env, conn=conn, directory=directory)
        self._tools(episode)
        self.episodes[episode.id] = episode
        return {"area": os.path.basename(directory)}

    def _database_bytes(self, env: LoadedEnv) -> int:
        """The most an episode's database of `env` may hold: its world and the growth an episode is allowed."""
        return len(env.world) + int(self.config.get("episode_db_growth_mb", 8)) * 1024 * 1024

    def op_call(self, request: CallRequest, blobs: list[bytes]) -> tuple[CallReply, list[bytes]]:
        episode = self._episode(request)
        name = request["tool"]
        tool = self._tools(episode).get(name)
        if tool is None:
            raise Failure("tool_error", f"unknown tool {name!r}")
        conn = episode.conn
        assert conn is not None
        if not episode.bounded:  # its database may grow by its allowance at most (set here, at first need)
            episodedb.limit_growth(conn, self._database_bytes(episode.env))
            episode.bounded = True
        arguments = request.get("arguments") or {}
        changes = episodedb.begin_call(conn, episode.env.tools_kind)
        self.host.current_conn = conn
        try:
            text, stdout = self.host.run(
                lambda: json_text(tool(arguments)),
                episode=episode,
                files=(episode.env.tools_kind.code_file,),
            )
            if len(text) > MAX_RESULT_BYTES:
                raise Failure(
                    "env_error", f"tool result of {len(text)} bytes exceeds {MAX_RESULT_BYTES}", "result_size"
                )
        except Failure as failure:
            episodedb.end_call(conn, commit=False)
            if failure.limit is None and episodedb.DATABASE_FULL in failure.error:  # its writes met max_page_count
                raise Failure("env_error", self._database_full(episode, failure.error), "database_size") from None
            raise
        except BaseException:
            episodedb.end_call(conn, commit=False)
            raise
        finally:
            self.host.current_conn = None
        episodedb.end_call(conn, commit=True)
        changed = episodedb.changed_since(conn, changes)
        return {"stdout": stdout, "changed": changed}, [text.encode()]  # ASCII: json_text escapes the rest

    def _database_full(self, episode: OpenEpisode, error: str) -> str:
        """The answer of a call whose writes did not fit its episode's database (or the disk)."""
        growth = int(self.config.get("episode_db_growth_mb", 8))
        return (
            f"sandbox limit database_size: the episode's database may hold "
            f"{self._database_bytes(episode.env) / 1048576:.1f} MB (its world's and {growth} MB more, "
            f"WORLDSMITH_SANDBOX_EPISODE_DB_GROWTH_MB), or the disk is full: {error}"
        )

    def op_snapshot(self, request: SnapshotRequest, blobs: list[bytes]) -> tuple[StatusOnly, list[bytes]]:
        episode = self._episode(request)
        assert episode.conn is not None  # opened by _episode
        return {}, [snapshot(episode.conn, transactions=refuse_transaction_control)]

    def op_restore(self, request: RestoreRequest, blobs: list[bytes]) -> StatusOnly:
        if self.strict:  # the bytes become the file (where no episode's code can write: see OpenEpisode)
            episode = self.episodes.get(request["episode"])
            if episode is None:
                raise Failure("env_error", f"episode {request['episode']} is not open in this worker")
            self.processes.stop_episode_process(episode.id)  # it holds the database open
            write_db(episode.db_path, blobs[0] if blobs else episode.env.world)
            return {}
        episode = self._episode(request)
        assert episode.conn is not None  # opened by _episode
        restore(episode.conn, blobs[0] if blobs else episode.env.world, transactions=refuse_transaction_control)
        episode.bounded = False  # a database deserialized afresh: bounded again at the next call
        return {}

    def op_diff(self, request: DiffRequest, blobs: list[bytes]) -> tuple[StatusOnly, list[bytes]]:
        before = deserialize(blobs[0], read_only=True)
        after = deserialize(blobs[1], read_only=True) if len(blobs) > 1 else self._episode(request).conn
        assert after is not None  # opened by _episode
        try:
            return {}, [json.dumps(dbdiff.diff(before, after), separators=(",", ":"), default=str).encode()]
        finally:
            before.close()

    def op_query(self, request: QueryRequest, blobs: list[bytes]) -> tuple[StatusOnly, list[bytes]]:
        episode = self._episode(request)
        assert episode.conn is not None  # opened by _episode
        copy = deserialize(snapshot(episode.conn, transactions=refuse_transaction_control), read_only=True)
        try:
            outcomes = run_read_queries(
                copy,
                list(request["queries"]),
                max_rows=int(request["max_rows"]),
                query_s=float(request["query_s"]),
                total_s=float(request["total_s"]),
            )
        finally:
            copy.close()
        return {}, [json.dumps(outcomes, separators=(",", ":")).encode()]

    def op_verify(self, request: VerifyRequest, blobs: list[bytes]) -> tuple[VerifyReply, list[bytes]]:
        episode = self._episode(request)
        kind = episode.env.verifiers_kind
        verdict, evidence = kind.verify(self.host, episode, request["verifier"], request.get("answer") or "")
        return {"verdict": verdict.value}, [_capped_evidence(evidence)]

    def op_close(self, request: CloseRequest, blobs: list[bytes]) -> StatusOnly:
        episode = self.episodes.pop(request["episode"], None)
        self.processes.stop_episode_process(request["episode"])
        if episode is not None:
            if episode.conn is not None:
                sqlite3.Connection.close(episode.conn)
            shutil.rmtree(episode.directory, ignore_errors=True)  # removes links, never follows them
            if self.strict:
                episodedb.remove_db(episode.db_path)
        return {}

    # -- the worker ------------------------------------------------------------------------
    def op_ping(self, request: PingRequest, blobs: list[bytes]) -> PingReply:
        if self.strict and request.get("settle") is True:
            self.refill_spares(lambda: False, settle=True)
        self.processes.sweep_handed()
        processes = self.processes.pids()
        spares = [spare.process.pid for spare in self.processes.spares]
        return {"episodes": len(self.episodes), "envs": len(self.envs), "processes": processes, "spares": spares}

    def op_reap(self, request: ReapRequest, blobs: list[bytes]) -> ReapReply:
        """The parent gave up an episode's direct channel (its process timed out, died, broke the reply
        contract or ran code that broke a limit): stop the process and say how it ended."""
        grace = request.get("grace_s")
        grace_s = float(grace) if isinstance(grace, (int, float)) else 0.0
        pid = request.get("pid")
        only = pid if isinstance(pid, int) else None
        return {"ending": self.processes.reap_handed(request.get("episode"), grace_s, only)}
