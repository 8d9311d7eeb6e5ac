"""The sandbox worker process: its entry point and its request loop. Stdlib only.

Started by `worldsmith.runtime.worker_launch` as `python -I -S -B -c ...` with a scrubbed environment (workers of
ASGI environments without `-S`: they import the web stack from site-packages before confining themselves).
`main` loads the modules generated code may use, confines itself (kernel layers, then the Python
guard), says hello, and then `Worker.serve` answers one request at a time over stdin/stdout frames.
Every module of the worker is imported here, at the top, before the process confines itself: after
that it reads nothing outside the standard library (and, in ASGI workers, site-packages); tests/test_layers.py
checks that none of them is imported later.

The parts: `operations` (what each request op does, on the loaded environments and open episodes),
`host` (how generated code runs: the environments' kinds' Host), `episodedb` (episode databases and
the transaction the runtime owns), `processes` (strict isolation: the processes forked per episode
and per request, by the worker's `template`), `records` (`LoadedEnv`, `OpenEpisode`), `failure`
(`Failure`, an operation's outcome that becomes its reply), and the guard (`guard`, with `auditpolicy`,
`namespace`, `modulestate`).
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import importlib
import io
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import Any, cast

from worldsmith.bundle.codepolicy import ALLOWED_MODULES
from worldsmith.bundle.kinds import EnvFault
from worldsmith.jsonvalue import JsonObject
from worldsmith.runtime.sandbox import guard, kernel, worldclock
from worldsmith.runtime.sandbox.failure import Failure
from worldsmith.runtime.sandbox.guard import Guard, SandboxViolation
from worldsmith.runtime.sandbox.host import SandboxHost
from worldsmith.runtime.sandbox.messages import (
    CallRequest,
    Hello,
    OpReply,
    Reply,
    Request,
    RunIdentity,
    SpareClaim,
    WorkerConfig,
    as_request,
)
from worldsmith.runtime.sandbox.operations import Operations
from worldsmith.runtime.sandbox.processes import ForkedProcesses
from worldsmith.runtime.sandbox.protocol import (
    MAX_ERROR_CHARS,
    FrameReader,
    ProtocolClosed,
    ready,
    truncated,
    write_frame,
)
from worldsmith.runtime.sandbox.records import OpenEpisode
from worldsmith.runtime.sandbox.template import TemplateLost

# Modules that allowed modules import lazily; loaded before the filesystem is closed.
EXTRA_PRELOAD = ("_strptime", "encodings.idna", "encodings.ascii", "encodings.latin_1", "json.decoder", "json.encoder")

#: Requests that run generated code or read an episode's database. Under strict isolation each runs
#: in a process forked by the worker's template (`template.py`), never in the worker itself.
RUN_OPS = frozenset({"call", "verify", "snapshot", "diff", "query", "routes", "check_env"})

#: An op of the worker's (`Operations.op_<name>`): its part of the reply, with the reply's blobs where
#: it has any. Each takes its own op's request (`messages`): the request's op picks it.
Operation = Callable[[Any, list[bytes]], OpReply | tuple[OpReply, list[bytes]]]


class Worker:
    """Serves one request at a time: each request op is a method of its `operations`, or (strict
    isolation, `RUN_OPS`) is served by a process forked for it (`processes`)."""

    def __init__(
        self,
        config: WorkerConfig,
        out: io.BufferedWriter,
        control: tuple[socket.socket, socket.socket] | None = None,
    ):
        self.out = out
        # "strict": every request of RUN_OPS runs in a process forked for it by the template (`_forked`);
        # "fast": here, episodes of the worker's one environment sharing this interpreter
        self.strict = config.get("isolation") == "strict"
        self.run_process = False  # True in a process forked for requests
        self.served_episodes = False  # whether it decoded any request but load_env and ping (`_start_template`)
        self.host = SandboxHost(config)
        self.processes = ForkedProcesses(
            config,
            strict=self.strict,
            control=control,
            become=self._become_run_process,
            claimed=self._claimed,
            warm=self._warm_spare,
            probe=self._probe_calls,
            handle=self.handle,
        )
        self.operations = Operations(
            config, self.host, self.processes, strict=self.strict, start_template=self._start_template
        )

    def _forked(self, request: Request, blobs: list[bytes]) -> tuple[Reply, list[bytes]]:
        """Serve a request of RUN_OPS in a process the template forked (`ForkedProcesses.serve`)."""
        return self.processes.serve(request, blobs, self.operations.episodes)

    def _start_template(self) -> None:
        """Strict isolation, the environment loaded: fork the template that every process running
        generated code will be forked from, if this worker has decoded no request but `load_env` and
        `ping` yet (the template must hold nothing of any episode)."""
        if self.served_episodes:
            raise Failure("env_error", "a worker under strict isolation loads its environment before any episode")
        self.processes.start_template(self._become_template)

    def _become_template(self) -> None:
        """In the template, freshly forked: drop the worker's channels (to the parent, for requests and
        for handing pipes over); its stdin becomes /dev/null. It holds the loaded environment, no
        episode. Then, unable to start a thread from now on (`kernel.forbid_threads`), it builds what
        the environment's episodes share (an ASGI app: `Operations.build_shared`), before it forks any."""
        os.dup2(1, 0)  # the request channel becomes /dev/null (as stdout is); SQLite never takes fds 0-2
        self.out.close()  # the reply channel to the parent
        for fd in self.processes.inherited_fds():  # the channel socket (no process is forked yet)
            os.close(fd)
        with contextlib.suppress(OSError):  # no seccomp here: the guard refuses threads to generated code
            kernel.forbid_threads()
        self.operations.build_shared()

    def _become_run_process(self, identity: RunIdentity) -> None:
        """In a process the template forked, told whose it is: forget the environments but its own, take
        its episode (if any) and open its database, then confine this process to the episode's file area
        (Landlock), without new processes and under the whole seccomp deny list (`kernel.confine_run`);
        it dies with the template, which dies with the worker. Of the worker's descriptors it holds none (the template
        dropped them, and its own socket is closed): only its two pipes. A spare (a directory, no episode
        yet) does the same for the episode that will claim it (`_claimed`)."""
        self.run_process = True
        kernel.die_with_parent()
        operations = self.operations
        env = operations.envs.get(identity["env"] or "")
        operations.envs = {env.key: env} if env is not None else {}
        writable = []
        if env is not None and identity["directory"] is not None:
            episode_id = identity["episode"] if identity["episode"] is not None else ""  # "": a spare's, unclaimed
            episode = OpenEpisode(id=episode_id, env=env, conn=None, directory=identity["directory"])
            operations.episodes = {episode.id: episode}
            with contextlib.suppress(ValueError):  # a bad clock: each request's `_set_clock` says so
                worldclock.set_clock(env.clock, _skew(identity["skew_s"]))  # the SQL clock binds to it (bind_sql)
            operations.open_database(episode)  # the database and its journal: beside the file area, not in it
            writable.append(episode.directory)
        kernel.confine_run(writable)

    def _warm_spare(self) -> None:
        """In a spare, confined, that no episode has claimed yet: for an ASGI environment, its first
        request's pages touched now (`SandboxHost.warm_app`)."""
        for env in self.operations.envs.values():
            self.host.warm_app(env)

    def _probe_calls(self) -> None:
        """In the probe of the environment's first calls (`firstpages`), confined and holding no
        episode: one call of each of its app's tools with stand-in arguments (1 for each path parameter,
        nothing else), whatever they answer, so that the pages a first call writes are written."""
        for env in self.operations.envs.values():
            for number, (name, route) in enumerate(sorted(env.routes.items())):
                stand_in: JsonObject = {parameter: 1 for parameter in route.path_params}
                call: CallRequest = {"op": "call", "id": number, "episode": "", "tool": name, "arguments": stand_in}
                self.handle(call, [])

    def _claimed(self, claim: SpareClaim) -> None:
        """In a spare, confined already: it is now the process of the episode `claim` names (its file
        area and database are the spare's), with that episode's clock skew."""
        operations = self.operations
        episodes = list(operations.episodes.values())
        operations.episodes = {}
        if len(episodes) != 1 or not isinstance(claim.get("episode"), str):
            return  # no episode: every request is answered "not open in this worker"
        episode = episodes[0]
        episode.id = claim["episode"]
        operations.episodes = {episode.id: episode}
        skew = _skew(claim.get("skew_s"))
        with contextlib.suppress(ValueError):
            worldclock.set_clock(episode.env.clock, skew)
        if skew and episode.conn is not None:  # its SQL clock was bound without a skew (or not at all)
            worldclock.bind_sql(episode.conn, episode.env.clock)

    # -- requests ------------------------------------------------------------------------
    def _set_clock(self, request: Request) -> None:
        """The world's clock for the request's code: its environment's instant, its skew (`worldclock`)."""
        env = self.operations.request_env(request)
        clock = env.clock if env is not None else None
        try:
            worldclock.set_clock(clock, _skew(request.get("skew_s")))
        except ValueError:
            raise Failure("env_error", f"the world's clock {clock!r} is not an ISO instant (manifest clock)") from None

    def handle(self, request: Request, blobs: list[bytes]) -> tuple[Reply, list[bytes]]:
        started = time.perf_counter()
        op = str(request.get("op"))
        self.served_episodes = self.served_episodes or op not in ("load_env", "ping")
        if op != "first_pages" and self.processes.prober is not None:  # the parent did not read it: it goes
            self.processes.end_probe()
        forked = self.strict and not self.run_process and op in RUN_OPS
        operation: Operation | None = None if forked else getattr(self.operations, "op_" + op, None)
        reply_blobs: list[bytes] = []
        seed = request.get("seed")
        self.host.seed = seed if isinstance(seed, int) and 0 <= seed < 2**64 else 0
        reply: Reply
        try:
            self._set_clock(request)
            if forked:  # the process's reply, checked (`ForkedProcesses.serve`)
                reply, reply_blobs = self._forked(request, blobs)
            elif operation is None:
                raise Failure("env_error", f"unknown operation {request.get('op')!r}")
            else:
                result = operation(request, blobs)
                if isinstance(result, tuple):
                    result, reply_blobs = result
                reply = cast(Reply, {"status": "ok", **result})  # mypy cannot spread a union of TypedDicts
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
            guard.GUARD.refuse("memory", "worker out of memory")
        except TemplateLost:
            raise  # nothing can be forked cleanly any more: the worker goes (`serve`)
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
        error = reply.get("error")
        if isinstance(error, str):  # a forked process's reply is cut already: keep its mark
            reply["error"] = truncated(error, MAX_ERROR_CHARS + (64 if forked else 0))
        reply["seconds"] = time.perf_counter() - started
        reply["retire"] = bool(guard.GUARD.violations)
        if "id" in request:  # the parent accepts only the reply to the request it sent
            reply["id"] = request["id"]
        return reply, reply_blobs

    def serve(self) -> None:
        reader = FrameReader(0)
        while True:
            try:
                frame, blobs = reader.read()
            except ProtocolClosed:
                return
            try:
                reply, reply_blobs = self.handle(as_request(frame), blobs)
                write_frame(self.out, reply, reply_blobs)
                if self.strict:  # after the reply, and only while no request waits: spares for episodes to come
                    self.operations.refill_spares(lambda: reader.pending() or ready(0, 0.0))
            except TemplateLost as lost:  # the parent replaces the worker and moves its episodes (a crash)
                sys.stderr.write(f"{lost}; exiting\n")
                sys.stderr.flush()
                os._exit(70)


#: The largest clock skew a request may ask for (seconds; a century).
MAX_SKEW_S = 100 * 365 * 86400.0


def _skew(value: object) -> float:
    """A request's clock skew (`skew_s`: seconds every real-time source of its code is shifted by,
    see worldclock): a finite number within MAX_SKEW_S, else 0."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= MAX_SKEW_S:
        return float(value)
    return 0.0


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
    config: WorkerConfig = json.loads(sys.argv[1])
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
    guard.GUARD = Guard(frameworks=frameworks, call_files=int(config.get("call_files", 64)))
    strict = config.get("isolation") == "strict"
    # strict: the socket pair to the template (`template.py`), made now: the seccomp layer forbids it after
    control = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET) if strict else None
    layers = kernel.confine(
        uid=config["uid"],
        memory_bytes=config["memory_mb"] * 1024 * 1024,
        file_bytes=config["file_size_mb"] * 1024 * 1024,
        cpu_seconds=config["lifetime_cpu_s"],
        read_paths=list(guard.GUARD.read_roots),
        write_paths=[scratch],
        zygote=strict,
        open_files=kernel.OPEN_FILES + (2 * int(config.get("episode_processes", 128)) + 32 if strict else 0),
    )
    layers["isolation"] = (
        "strict (episodes and requests in processes forked from this worker's template)"
        if strict
        else "fast (episodes of one environment share this worker)"
    )

    guard.GUARD.install()
    sys.setrecursionlimit(config.get("recursion_limit", 1000))
    hello: Hello = {"status": "ok", "op": "hello", "pid": os.getpid(), "layers": layers}
    write_frame(out, hello)
    Worker(config, out, control).serve()


if __name__ == "__main__":
    main()
