"""The worker's operations: one `op_<name>` method per request op, on its environments and episodes. Stdlib only.

`Operations` holds what a worker has loaded (`LoadedEnv` by key) and opened (`OpenEpisode` by id) and
answers each request with a dict (some with blobs), or raises `Failure`. How an environment's tools
open and how its verifiers run is its kinds' business (`bundle/kinds.py`): they get the worker's
`SandboxHost`. Under fast isolation the operations run here, episodes' databases in memory; under
strict isolation the worker keeps only records and files, and the requests of `worker.RUN_OPS` are
served by processes forked from it (`ForkedProcesses`), where these same operations run on the
episode's database file.
"""

from __future__ import annotations

import gc
import json
import os
import shutil
import sqlite3
import sys
from typing import Any

from worldsmith.bundle.jsonvalues import json_text
from worldsmith.bundle.kinds import TOOLS_KINDS, VERIFIERS_KINDS, Tool
from worldsmith.bundle.sqlscript import deserialize, restore, snapshot
from worldsmith.runtime.sandbox import dbdiff, episodedb
from worldsmith.runtime.sandbox.episodedb import refuse_transaction_control, write_db
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.host import SandboxHost, app_module_name
from worldsmith.runtime.sandbox.processes import ForkedProcesses
from worldsmith.runtime.sandbox.protocol import truncated
from worldsmith.runtime.sandbox.records import LoadedEnv, OpenEpisode

MAX_RESULT_BYTES = 4 * 1024 * 1024
MAX_EVIDENCE_BYTES = 1024 * 1024  # a verifier's evidence as JSON, replaced by a marked excerpt beyond this


def _capped_evidence(evidence: dict[str, Any]) -> dict[str, Any]:
    """A verifier's evidence as sent back: whole up to MAX_EVIDENCE_BYTES of JSON, else a marked excerpt."""
    try:
        text = json_text(evidence)
    except (ValueError, TypeError, RecursionError) as exc:
        raise Failure("env_error", f"verifier evidence cannot be sent: {type(exc).__name__}: {exc}") from None
    if len(text) <= MAX_EVIDENCE_BYTES:
        return evidence
    return {"truncated": truncated(text, MAX_EVIDENCE_BYTES)}


class Operations:
    """A worker's loaded environments and open episodes, and the operations requests perform on them."""

    def __init__(self, config: dict[str, Any], host: SandboxHost, processes: ForkedProcesses, *, strict: bool):
        self.config = config
        self.host = host  # what the environments' kinds run generated code through
        self.processes = processes  # strict isolation: the processes forked for episodes and requests
        self.strict = strict
        self.scratch: str = config["scratch"]
        self.envs: dict[str, LoadedEnv] = {}
        self.episodes: dict[str, OpenEpisode] = {}

    def request_env(self, header: dict[str, Any]) -> LoadedEnv | None:
        """The loaded environment a request is for (through its episode, else its `env`), if any."""
        episode = self.episodes.get(header.get("episode"))  # type: ignore[arg-type]
        return episode.env if episode is not None else self.envs.get(header.get("env"))  # type: ignore[arg-type]

    # -- environments ----------------------------------------------------------------------
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
            check = {"op": "check_env", "env": env.key, "timeout_s": header.get("timeout_s")}
            reply, _ = self.processes.serve(check, [], self.episodes)
            if reply.get("status") != "ok":
                env.load_error = str(reply.get("error"))
        gc.freeze()  # what forked processes share stays untouched by their collections (fewer page copies)
        return {}

    def op_check_env(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """Open the environment's tools once on a private copy of its world (strict isolation's load check)."""
        env = self.envs[header["env"]]
        conn = episodedb.memory_connection(env.world, env.tools_kind, env.clock)
        env.tools_kind.open(self.host, env, OpenEpisode(id="check", env=env, conn=conn, directory=self.scratch))
        return {}

    def op_unload_env(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        env = self.envs.pop(header["env"], None)
        for episode in [e for e in self.episodes.values() if e.env is env]:
            self.processes.stop_episode_process(episode.id)
        if env is not None and env.app is not None:
            sys.modules.pop(app_module_name(env.key), None)
        return {}

    def op_routes(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """The tools of an ASGI environment's app: one JSON schema per route."""
        env = self.envs.get(header["env"])
        schemas = env.tools_kind.schemas(self.host, env) if env is not None else None
        if schemas is None:
            raise Failure("env_error", f"ASGI environment {header['env']} is not loaded in this worker")
        return {"tools": schemas}

    # -- episodes --------------------------------------------------------------------------
    def _episode(self, header: dict[str, Any]) -> OpenEpisode:
        try:
            episode = self.episodes[header["episode"]]
        except KeyError:
            raise Failure("env_error", f"episode {header['episode']} is not open in this worker") from None
        if episode.conn is None:  # strict isolation, in the request's own process
            env = episode.env
            episode.conn = episodedb.file_connection(episode.db_path, env.world, env.tools_kind, env.clock)
        return episode

    def _tools(self, episode: OpenEpisode) -> dict[str, Tool]:
        if episode.tools is None:
            episode.tools = episode.env.tools_kind.open(self.host, episode.env, episode)
        return episode.tools

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
            episode = OpenEpisode(id=header["episode"], env=env, conn=None, directory=directory)
            if blobs:
                write_db(episode.db_path, blobs[0])
            self.episodes[episode.id] = episode
            return {}
        conn = episodedb.memory_connection(blobs[0] if blobs else env.world, env.tools_kind, env.clock)
        episode = OpenEpisode(id=header["episode"], env=env, conn=conn, directory=directory)
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
        arguments = header.get("arguments") or {}
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
        except BaseException:
            episodedb.end_call(conn, commit=False)
            raise
        finally:
            self.host.current_conn = None
        episodedb.end_call(conn, commit=True)
        changed = episodedb.changed_since(conn, changes)
        return {"status": "ok", "value": json.loads(text), "stdout": stdout, "changed": changed}

    def op_snapshot(self, header: dict[str, Any], blobs: list[bytes]) -> tuple[dict[str, Any], list[bytes]]:
        episode = self._episode(header)
        assert episode.conn is not None  # opened by _episode
        return {}, [snapshot(episode.conn, transactions=refuse_transaction_control)]

    def op_restore(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        if self.strict:  # the bytes become the file; read only by the episode's own processes
            episode = self.episodes.get(header["episode"])
            if episode is None:
                raise Failure("env_error", f"episode {header['episode']} is not open in this worker")
            self.processes.stop_episode_process(episode.id)  # it holds the database open
            write_db(episode.db_path, blobs[0] if blobs else episode.env.world)
            return {}
        episode = self._episode(header)
        assert episode.conn is not None  # opened by _episode
        restore(episode.conn, blobs[0] if blobs else episode.env.world, transactions=refuse_transaction_control)
        return {}

    def op_diff(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        before = deserialize(blobs[0], read_only=True)
        after = deserialize(blobs[1], read_only=True) if len(blobs) > 1 else self._episode(header).conn
        assert after is not None  # opened by _episode
        try:
            return {"diff": dbdiff.diff(before, after)}
        finally:
            before.close()

    def op_verify(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        episode = self._episode(header)
        kind = episode.env.verifiers_kind
        verdict, evidence = kind.verify(self.host, episode, header["verifier"], header.get("answer") or "")
        return {"verdict": verdict.value, "evidence": _capped_evidence(evidence)}

    def op_close(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        episode = self.episodes.pop(header["episode"], None)
        self.processes.stop_episode_process(header["episode"])
        if episode is not None:
            if episode.conn is not None:
                sqlite3.Connection.close(episode.conn)
            shutil.rmtree(episode.directory, ignore_errors=True)
        return {}

    # -- the worker ------------------------------------------------------------------------
    def op_ping(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        self.processes.sweep_handed()
        processes = self.processes.pids()
        return {"episodes": len(self.episodes), "envs": len(self.envs), "processes": processes}

    def op_reap(self, header: dict[str, Any], blobs: list[bytes]) -> dict[str, Any]:
        """The parent gave up an episode's direct channel (its process timed out, died, broke the reply
        contract or ran code that broke a limit): stop the process and say how it ended."""
        grace = header.get("grace_s")
        grace_s = float(grace) if isinstance(grace, (int, float)) else 0.0
        return {"ending": self.processes.reap_handed(header.get("episode"), grace_s)}
