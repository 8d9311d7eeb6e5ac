"""Exceptions of the runtime. Stdlib only: the sandbox worker imports this module."""

from __future__ import annotations

from worldsmith.errors import WorldsmithError


class ToolError(WorldsmithError):
    """A business-rule refusal raised by a tool ("order 7 is already shipped").

    It reaches the agent as a tool error; any other exception from a tool is an env_error.
    """


class RuntimeFault(WorldsmithError, RuntimeError):
    """The runtime could not do what was asked (episode closed, unknown task, ...)."""


class WorkerLost(WorldsmithError, RuntimeError):
    """A sandbox worker died or was retired. `in_flight` is True when the lost request was
    executing (it may have had effects); False when it never started."""

    def __init__(self, reason: str, *, in_flight: bool, limit: str | None = None):
        super().__init__(reason)
        self.reason = reason
        self.in_flight = in_flight
        self.limit = limit
