"""Serving worlds to agents outside worldsmith: the MCP gateway (gateway.py) and what it tells clients
about each tool (mcp_tools.py: schemas, output shapes, behaviour hints observed in the sandbox)."""
