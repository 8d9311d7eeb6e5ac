"""A world the gateway has loaded (`ServedWorld`), and a world it cannot serve now (`WorldUnavailable`).

A loaded world holds its bundle, the MCP server and session manager answering its sessions (running
from `run` until `unload`), its tools as MCP lists them (observed once, at the first listing), its lanes
of gateway threads (serving/lanes.py: no other world's requests wait for them), and `active`: its open
episodes plus its requests in flight. The gateway (serving/gateway.py) counts
`active` and unloads a world only at 0.
"""

from __future__ import annotations

from collections.abc import Callable

import anyio
import anyio.abc
import mcp_types as types
from mcp.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

from worldsmith.bundle.contract import Bundle
from worldsmith.errors import WorldsmithError
from worldsmith.runtime.episode import Runtime
from worldsmith.serving.lanes import ServingLimits, WorldLanes
from worldsmith.serving.mcp_tools import mcp_tools, observe, output_shapes


class WorldUnavailable(WorldsmithError):
    """A world named to the gateway that cannot be served now; the message is one line saying why."""


class ServedWorld:
    """A loaded world: its bundle, its MCP server (made by `server` from the world) and session
    manager (running while loaded, at most `max_sessions` sessions), what its tools look like, and its
    lanes (`limits`: how much of the gateway it may hold). `active` counts its open episodes and its
    requests in flight: a world is unloaded only at 0."""

    def __init__(
        self,
        bundle: Bundle,
        server: Callable[[ServedWorld], Server],
        *,
        max_sessions: int,
        limits: ServingLimits | None = None,
    ):
        self.env_id = bundle.env_id
        self.bundle = bundle
        self.lanes = WorldLanes(bundle.env_id, limits or ServingLimits())
        self.outputs = output_shapes(bundle)
        self.tasks = {t.id: t for t in bundle.tasks}
        self.active = 0
        self._tools: list[types.Tool] | None = None
        self._describing = anyio.Lock()
        self._unloaded = anyio.Event()
        self.manager = StreamableHTTPSessionManager(
            app=server(self),
            json_response=True,  # one JSON body per call: no SSE stream, no task per request (docs/benchmarks.md)
            stateless=False,
            session_idle_timeout=None,  # the gateway expires idle sessions itself (hot-path calls are activity)
            max_sessions=max_sessions,
        )

    async def tools(self, runtime: Runtime) -> list[types.Tool]:
        """The tools as MCP lists them; their hints are observed once, at the first listing."""
        async with self._describing:
            if self._tools is None:
                evidence = await self.lanes.control(observe, runtime, self.bundle)
                self._tools = mcp_tools(self.bundle, self.outputs, evidence)
        return self._tools

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Run the session manager until `unload`."""
        async with self.manager.run():
            task_status.started()
            await self._unloaded.wait()

    def unload(self) -> None:
        self._unloaded.set()
