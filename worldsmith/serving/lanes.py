"""Fair serving: each loaded world's own lanes of gateway threads, so no world waits on another's requests.

The runtime's calls block (a pipe read, a worker's lock), so the gateway runs them in threads. One pool
for every world let a slow world hold every thread: 60 sessions whose first calls hit a 4.5 s tool made
another world's `initialize` wait 94 s (issue 32). Each loaded world has lanes of its own (`WorldLanes`):

- **calls** (tool calls and `submit`, a large result's check included): at most `world_calls` run at once, each in a thread; up to
  `world_waiting` more wait for one of them without holding a thread (an async wait); past that a
  call is refused at once (`WorldBusy`: an MCP error naming the limit and its setting);
- **control** (opening and closing its episodes: `initialize` and the end of a session; observing its
  tools at the first `tools/list`): at most `world_control` at once, never behind the calls.

Nothing is shared between worlds: a world's requests wait only for that world's own (and for its own
sandbox workers: runtime/pool.py never gives one world's worker to another's episodes). The threads
in use are at most `world_calls + world_control` per loaded world.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import anyio
import anyio.to_thread

from worldsmith.errors import WorldsmithError
from worldsmith.settings import Settings, env_name, get_settings

T = TypeVar("T")

#: The JSON-RPC error code of a call refused because its world is at its limits (a server error of
#: JSON-RPC's implementation-defined range: MCP defines none for it).
WORLD_BUSY = -32000


@dataclass(frozen=True)
class ServingLimits:
    """How much of the gateway one world may hold at once (the settings `gateway_world_*`)."""

    world_calls: int = 32
    world_waiting: int = 1024
    world_control: int = 8

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> ServingLimits:
        s = settings or get_settings()
        return cls(
            world_calls=s.gateway_world_calls,
            world_waiting=s.gateway_world_waiting,
            world_control=s.gateway_world_control,
        )


class WorldBusy(WorldsmithError):
    """A call refused because its world has as many calls running and waiting as its limits allow; the
    message is one line naming the limits and their settings."""


class WorldLanes:
    """The lanes of loaded world `env_id` (see the module docstring)."""

    def __init__(self, env_id: str, limits: ServingLimits):
        self.env_id = env_id
        self.limits = limits
        self._calls = anyio.CapacityLimiter(limits.world_calls)
        self._control = anyio.CapacityLimiter(limits.world_control)

    @property
    def calls_in_flight(self) -> int:
        """The world's calls running or waiting for a thread."""
        return int(self._calls.borrowed_tokens) + self._calls.statistics().tasks_waiting

    def admit(self) -> None:
        """WorldBusy when a call now would wait behind `world_waiting` others (the world's lanes are full)."""
        limiter = self._calls
        if limiter.available_tokens < 1 and limiter.statistics().tasks_waiting >= self.limits.world_waiting:
            raise WorldBusy(
                f"gateway limit world_calls: {self.env_id} has {self.limits.world_calls} tool calls running and "
                f"{self.limits.world_waiting} waiting ({env_name('gateway_world_calls')}, "
                f"{env_name('gateway_world_waiting')}); retry when one has ended"
            )

    async def call(self, fn: Callable[..., T], *args: object, admitted: bool = False) -> T:
        """`fn(*args)` in a thread of the calls lane; WorldBusy, at once, when the lanes are full (`admit`).
        `admitted`: more work of a call that was admitted (checking its large result), never refused."""
        if not admitted:
            self.admit()
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._calls)

    async def control(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` in a thread of the control lane (opening, closing episodes; observing tools)."""
        return await anyio.to_thread.run_sync(fn, *args, limiter=self._control)
