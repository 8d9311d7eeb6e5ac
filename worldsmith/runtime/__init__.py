"""Sandboxed tool execution, episodes and the MCP gateway.

Generated tools import `ToolError` from here; nothing heavier may be imported at package level
(the sandbox worker runs without site-packages).
"""

from worldsmith.runtime.errors import ToolError

__all__ = ["ToolError"]
