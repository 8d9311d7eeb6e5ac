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
    load_error: str | None = None  # strict isolation: why the tools do not load (checked once)


@dataclass
class OpenEpisode:
    """An episode open in this worker. Fast isolation: its database in memory (`conn`), its tools loaded
    at open. Strict isolation: its database is the file `db_path` in its directory, opened (with its
    tools) only in the processes that serve its requests; the worker itself never reads it."""

    id: str
    env: LoadedEnv
    conn: EpisodeConnection | None
    directory: str
    tools: dict[str, Tool] | None = None

    @property
    def db_path(self) -> str:
        return os.path.join(self.directory, "episode.db")
