"""The worker protocol's messages, typed: its start configuration, its requests and its replies. Stdlib only.

A request is a frame header (`protocol`) whose `op` names what it asks: one `TypedDict` per op, each
with the fields its op reads plus `RequestFields`, the fields the runtime adds to any request (its
id, its deadline, the call's seed and clock skew, a direct channel asked for). `Request` is any of
them; `EpisodeRequest` those the parent sends for an open episode (runtime/episode.py), which go to
the episode's own process where it has one (strict isolation).

A reply is one `Reply`: its `status`, a failure's `error`, `limit` and `refused_module`, its op's
fields (each op's part is a `TypedDict` of its own, what the worker's operations return) and the
runtime's fields (`seconds`, `retire`, `id`, `channel`, `pid`). A reply of a request's process is held to
the reply contract (`protocol.accepted_reply`) before it is read as a `Reply`; a frame of the parent
is read as a `Request` as it comes (`as_request`: the parent built it from these types), a frame of
the worker as a `Reply` once its id is the request's (`as_reply`).

The wire format is JSON: these types add no field and change no value, they name what is there.
"""

# No `from __future__ import annotations`: the annotations are read when each class is made, so that
# `NotRequired` counts at run time too (`__required_keys__`; a string annotation hides it).
from typing import Literal, NotRequired, Required, TypedDict, cast, final

from worldsmith.bundle.kinds import ToolsCode
from worldsmith.jsonvalue import JsonObject

#: How a request ended: done, refused as the agent's fault (a tool's refusal), or failed as the
#: environment's fault (its code, or a sandbox limit it broke: `limit`).
Status = Literal["ok", "tool_error", "env_error"]


class WorkerConfig(TypedDict):
    """A worker's configuration: its one command-line argument (runtime/worker_launch.py), as JSON."""

    scratch: str  # the worker's file area: every episode's directory is in it
    uid: int  # the unprivileged user it runs as
    memory_mb: int
    file_size_mb: int
    lifetime_cpu_s: int
    call_timeout_s: float  # wall clock per run of generated code
    cpu_s: float  # CPU time per run of generated code
    grace_s: float
    isolation: Literal["strict", "fast"]
    episode_processes: int  # strict isolation: the episode processes alive at once, at most
    spare_processes: int  # strict isolation: processes forked ahead of episodes (within episode_processes)
    call_files: int  # files a call may open for writing in its episode's file area
    episode_db_growth_mb: int  # how much an episode's database may grow beyond its world's
    frameworks: bool  # it imports the web stack of ASGI environments before it confines itself
    stand_in_reads: bool  # strict isolation, an app: its template makes its first requests if harmless (`standin`)
    channel_fd: int | None  # strict isolation: its end of the socket episode processes' pipes go over
    recursion_limit: NotRequired[int]  # default 1000


class Hello(TypedDict):
    """The worker's first frame, once it has confined itself: its pid and its confinement layers."""

    status: Literal["ok"]
    op: Literal["hello"]
    pid: int
    layers: dict[str, str]


class RunIdentity(TypedDict):
    """Strict isolation: the first frame a process forked for requests reads from the worker (before
    any request): whose requests it serves. `directory` is the episode's, the one it may write;
    `skew_s` its clock skew (the first request's: an episode's requests all carry its own), which the
    database's SQL clock is bound with when it opens (`worldclock.bind_sql`)."""

    env: str | None
    episode: str | None
    directory: str | None
    skew_s: float | None
    probe: NotRequired[bool]  # the probe of the world's first calls (`firstpages`), not a spare


class SpareClaim(TypedDict):
    """Strict isolation: the second frame a spare reads (`processes.ForkedProcesses.claim`), once an
    episode takes it: whose it is now. A spare's `RunIdentity` names no episode, only its directory."""

    episode: str
    skew_s: object


# -- requests -----------------------------------------------------------------------------------


class RequestFields(TypedDict, total=False):
    """The fields the runtime adds to any request, whatever its op."""

    id: int  # the parent's number for the request (unique per worker); its reply carries it back
    timeout_s: float  # the parent's deadline for the reply
    direct: bool  # strict isolation: hand the parent the episode process's pipes with the reply
    seed: int  # `random`'s seed for the request's generated code (0 when absent)
    skew_s: float  # seconds the world's clock is shifted by (worldclock)


@final
class LoadEnvRequest(RequestFields, ToolsCode):
    """Load an environment (runtime key `env`): its world (the one blob), its code and its kinds."""

    op: Literal["load_env"]
    env: str
    tools_kind: str | None
    verifiers: str  # verifiers.py
    verifiers_kind: NotRequired[str | None]
    tool_names: list[str]
    clock: NotRequired[str | None]  # the world's frozen instant (ISO), None: the real time
    check: NotRequired[bool]  # strict isolation: open the tools once to find a load error (default True)
    probe: NotRequired[bool]  # strict isolation, spares, an app: fork the probe of its first calls (`firstpages`)


@final
class FirstPagesRequest(RequestFields):
    """The pages the probe of the loaded environment wrote (the one blob, `firstpages.written_pages`),
    read by the parent from /proc: spares make them their own ahead; the probe goes."""

    op: Literal["first_pages"]
    env: str


@final
class CheckEnvRequest(RequestFields):
    """Open a loaded environment's tools once (strict isolation's load check; sent by the worker)."""

    op: Literal["check_env"]
    env: str


@final
class UnloadEnvRequest(RequestFields):
    """Unload an environment: its episodes' processes are stopped."""

    op: Literal["unload_env"]
    env: str


@final
class RoutesRequest(RequestFields):
    """The tools (one JSON schema per route) of a loaded ASGI environment."""

    op: Literal["routes"]
    env: str


@final
class OpenRequest(RequestFields):
    """Open episode `episode` of a loaded environment, on its world or on the database of the one blob."""

    op: Literal["open"]
    episode: str
    env: str


@final
class CallRequest(RequestFields):
    """Call tool `tool` of the episode with `arguments`."""

    op: Literal["call"]
    episode: str
    tool: str
    arguments: JsonObject  # the tool's arguments


@final
class SnapshotRequest(RequestFields):
    """The episode's database, serialized (the reply's one blob)."""

    op: Literal["snapshot"]
    episode: str


@final
class RestoreRequest(RequestFields):
    """Replace the episode's database by the one blob's (no blob: by the untouched world)."""

    op: Literal["restore"]
    episode: str


@final
class DiffRequest(RequestFields):
    """The rows changed from the first blob's database to the second's (one blob: to the episode's)."""

    op: Literal["diff"]
    episode: str


@final
class QueryRequest(RequestFields):
    """Run read-only `queries` (a world's invariants) on a copy of the episode's database, each within
    `query_s` seconds and all within `total_s`, at most `max_rows` rows of each read; their outcomes come
    as the reply's one blob, a JSON list of `bundle.readquery.QueryOutcome`."""

    op: Literal["query"]
    episode: str
    queries: list[str]
    max_rows: int
    query_s: float
    total_s: float


@final
class VerifyRequest(RequestFields):
    """Run the task's verifier `verifier` on the episode, with the agent's final `answer`."""

    op: Literal["verify"]
    episode: str
    verifier: str
    answer: str


@final
class CloseRequest(RequestFields):
    """Close the episode: its database, its files and its process go."""

    op: Literal["close"]
    episode: str


@final
class PingRequest(RequestFields):
    """How many episodes and environments the worker holds, and its episode processes; with `settle`
    (strict isolation), once its spares are all forked and ready (`ForkedProcesses.refill`)."""

    op: Literal["ping"]
    settle: NotRequired[bool]


@final
class ReapRequest(RequestFields):
    """Stop the process of `episode` whose direct channel the parent gave up, given `grace_s` to exit."""

    op: Literal["reap"]
    episode: str
    grace_s: float
    pid: NotRequired[int]  # only if its process is still this one (the parent made room for another fork)


#: A request the parent sends for an open episode (`SandboxEpisode`, `SandboxWorker.episode_request`).
EpisodeRequest = (
    CallRequest | SnapshotRequest | RestoreRequest | DiffRequest | QueryRequest | VerifyRequest | CloseRequest
)
#: Any request (spelled out: a type checker narrows a flat union by the fields its members have).
Request = (
    LoadEnvRequest
    | FirstPagesRequest
    | CheckEnvRequest
    | UnloadEnvRequest
    | RoutesRequest
    | OpenRequest
    | PingRequest
    | ReapRequest
    | CallRequest
    | SnapshotRequest
    | RestoreRequest
    | DiffRequest
    | QueryRequest
    | VerifyRequest
    | CloseRequest
)


def as_request(frame: dict[str, object]) -> Request:
    """A frame the worker (or a request's process) read from its requester, as a request. Not checked:
    the requester is the runtime, which built it as one of these types."""
    return cast(Request, frame)


def episode_of(request: Request) -> str | None:
    """The episode a request is for (None: it names none)."""
    # `in`, not `.get`: it narrows the union to the requests that have the field (for a type checker)
    return request["episode"] if "episode" in request else None  # noqa: SIM401


def env_of(request: Request) -> str | None:
    """The environment a request names (None: it names none; an episode's request names its episode)."""
    return request["env"] if "env" in request else None  # noqa: SIM401 (as in `episode_of`)


# -- replies ------------------------------------------------------------------------------------


class StatusOnly(TypedDict):
    """The part of an op's reply that answers with its status alone (load, open, restore, close ...)."""


class LoadEnvReply(TypedDict):
    """A loaded environment; `probe_pid`: its probe waits for the parent to read its pages
    (`FirstPagesRequest`)."""

    probe_pid: NotRequired[int]


class OpenReply(TypedDict):
    """An opened episode: the name of its file area (its database's too, under strict isolation); with
    a spare's process handed to the parent (a `direct` open), `channel` and that process's `pid`."""

    area: str
    channel: NotRequired[bool]
    pid: NotRequired[int]


class CallReply(TypedDict):
    """A tool call's answer; its value comes as the reply's one blob, the JSON text of the tool's result."""

    stdout: str  # what its code printed (cut)
    changed: bool  # whether it wrote to the episode's database


class VerifyReply(TypedDict):
    """A verifier's answer; its evidence comes as the reply's one blob, a JSON object (or a marked excerpt)."""

    verdict: str  # a `Verdict`'s value


class RoutesReply(TypedDict):
    """An ASGI environment's tools."""

    tools: list[JsonObject]  # one tool schema per route ({"name", "description", "parameters"})
    stand_in_reads: NotRequired[list[str]]  # strict isolation: the routes its template read ahead (`standin`)


class PingReply(TypedDict):
    """What the worker holds."""

    episodes: int
    envs: int
    processes: dict[str, int]  # the pid of each episode's process (strict isolation), by episode id
    spares: list[int]  # the pids of the spares no episode has claimed yet (strict isolation)


class ReapReply(TypedDict):
    """How a reaped process ended."""

    ending: str | None  # how the process ended (None: not known)


#: What an op of the worker's answers, beyond its status: its part of the reply.
OpReply = StatusOnly | OpenReply | CallReply | VerifyReply | RoutesReply | PingReply | ReapReply


class Reply(TypedDict, total=False):
    """A reply to a request, whatever its op: the fields of its op's part (`OpReply`) where it
    succeeded, else `error` (with the sandbox `limit` broken, and the module of a refused import)."""

    status: Required[Status]
    error: str | None
    limit: str | None
    refused_module: str | None
    # the ops' parts (what can be large comes as blobs: a call's value, a verifier's evidence, a diff's
    # rows per table as `models.results.DbDiff` has them, each as JSON)
    stdout: str
    changed: bool
    verdict: str
    tools: list[JsonObject]
    stand_in_reads: list[str]
    episodes: int
    envs: int
    processes: dict[str, int]
    spares: list[int]
    ending: str | None
    area: str  # `open`: the name of the episode's file area (the parent counts what it holds)
    # the runtime's
    seconds: float  # how long the worker took
    retire: bool  # the request's code broke a limit: the process that ran it is not to run more
    id: int  # the request's `id`
    channel: bool  # the episode process's pipes came with the reply (a `direct` request)
    unserved: bool  # ... of a process forked for it that has not served it: the parent sends it the request
    pid: int  # the pid of the episode's process that answered (strict isolation; set by the worker)


def as_reply(frame: dict[str, object]) -> Reply:
    """A frame the parent read from its worker, carrying the id of the request it sent, as a reply.
    Not checked here: the parent reads its fields through the models that check them (`ToolResult`,
    `VerifierResult` ...: runtime/episode.py)."""
    return cast(Reply, frame)
