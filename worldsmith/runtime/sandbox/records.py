"""The worker's records of what it holds: a loaded environment and an open episode. Stdlib only.

`LoadedEnv` is an environment as `op_load_env` received it (world, compiled code, kinds);
`OpenEpisode` is one episode of it, open in this worker (not `worldsmith.runtime.episode.Episode`,
the parent's handle on an episode). The environments' kinds (`bundle/kinds.py`) receive both as
the `env` and `episode` of their `Host` calls.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import CodeType
from typing import TYPE_CHECKING, Any

from worldsmith.bundle.kinds import Tool, ToolsKind, VerifiersKind
from worldsmith.runtime.sandbox.episodedb import EpisodeConnection

if TYPE_CHECKING:  # loaded late, by ASGI workers only (worker._preload)
    from worldsmith.runtime.sandbox.asgi import Route


@dataclass
class LoadedEnv:
    """An environment loaded in the worker (by its runtime key), from which its episodes open."""

    key: str
    world: bytes
    tools_kind: ToolsKind
    code: CodeType  # the tools' code: tools.py, or an app with its engine creation rewritten
    verifiers_kind: VerifiersKind
    verifiers_code: CodeType
    tool_names: list[str]
    clock: str | None = None  # ISO instant the code's clock reads answer (None: the real time); see worldclock
    app: Any = None  # an app object, made on first use
    routes: dict[str, Route] = field(default_factory=dict)
    stand_in_reads: tuple[str, ...] = ()  # strict isolation: the routes the template read ahead (`standin`)
    load_error: str | None = None  # strict isolation: why the tools do not load (checked once)


#: The directory of a worker's scratch directory that holds its episodes' database files (strict
#: isolation): no code of any episode may write there (docs/security.md, "Episode files").
DATABASES = "databases"


@dataclass
class OpenEpisode:
    """An episode open in this worker. Fast isolation: its database in memory (`conn`), its tools loaded
    at open. Strict isolation: its database is the file `db_path`, opened (with its tools) only in the
    processes that serve its requests, before they confine themselves; the worker itself never reads it.

    `directory` is the episode's file area, the only place its code may open files: a directory of the
    worker's scratch directory with an unguessable name, made when first needed. Its database file
    (strict isolation) has the same name in the scratch directory's `DATABASES`, beside it."""

    id: str
    env: LoadedEnv
    conn: EpisodeConnection | None
    directory: str
    tools: dict[str, Tool] | None = None
    open_error: str | None = None  # strict isolation: why its database did not open in this process
    bounded: bool = False  # its connection's growth is limited (`episodedb.limit_growth`, at its first call)

    @property
    def db_path(self) -> str:
        return database_path(self.directory)


def database_path(directory: str) -> str:
    """The database file of the episode whose file area is `directory` (strict isolation)."""
    scratch, name = os.path.split(directory)
    return os.path.join(scratch, DATABASES, name + ".db")
