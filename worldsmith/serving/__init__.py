"""Serving worlds to agents outside worldsmith: the MCP gateway (gateway.py: the worlds it serves and
loads, its live sessions, its HTTP routes), a loaded world (served_world.py), the MCP server of one world
(world_server.py), a live session and its expiry (sessions.py), the opt-in `submit` tool (submit.py),
tool results as MCP answers them (mcp_results.py), the worlds it serves, named up front and loaded at
first use (worlds.py), its answer to `tools/call` without the SDK's round trip (hotpath.py), what it
tells clients about each tool (mcp_tools.py: schemas, output shapes, behaviour hints observed in the
sandbox), and several gateway processes on one port (supervisor.py), each session kept by the process
that opened it (affinity.py, relay.py)."""
