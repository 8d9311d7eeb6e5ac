"""Sandboxed tool execution, episodes and the MCP gateway.

Generated tools import `ToolError` and `now` (the world's clock) from here; nothing heavier may be
imported at package level (the sandbox worker runs without site-packages).
"""

from worldsmith.runtime.errors import ToolError
from worldsmith.runtime.sandbox.worldclock import now

__all__ = ["ToolError", "now"]
