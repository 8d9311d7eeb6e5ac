"""What the MCP benchmarks (bench/runtime.py, bench/gateway.py) serve: variants of the golden bundle (an
`echo` tool added), and the bare `mcp` SDK's MCPServer serving an equivalent echo tool over streamable
HTTP, the baseline the gateway is measured against."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from mcp.server import MCPServer
from starlette.applications import Starlette

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from worldsmith.bundle.contract import Bundle
from worldsmith.bundle.loader import build_bundle

GOLDEN = ROOT / "examples" / "bundles" / "retail_store"
SOURCES = ("schema.sql", "seed.sql", "tools.py", "tasks.jsonl", "verifiers.py")
#: The tool both servers offer: its answer is its argument.
ECHO_TOOL = '''

def echo(conn, text: str) -> str:
    """Return the text unchanged.

    Args:
        text: Any text.
    """
    return text
'''
ECHO_ENV = "echo_env"


def variant(golden: Bundle, env_id: str, *, extra_seed: str = "", extra_tools: str = "") -> Bundle:
    """The golden bundle as `env_id`, with SQL appended to its seed and code to its tools."""
    sources = {name: golden.files[name] for name in SOURCES}
    sources["seed.sql"] += extra_seed.encode()
    sources["tools.py"] += extra_tools.encode()
    return build_bundle(sources, golden.manifest.model_copy(update={"env_id": env_id}))


def echo_world(golden: Bundle) -> Bundle:
    """The golden bundle with the `echo` tool, as ECHO_ENV."""
    return variant(golden, ECHO_ENV, extra_tools=ECHO_TOOL)


def sdk_echo_app(*, json_response: bool = False) -> Starlette:
    """The bare SDK's MCPServer serving `echo` at /mcp (streamable HTTP, stateful sessions)."""
    baseline = MCPServer("echo-baseline")

    @baseline.tool(name="echo")
    def echo(text: str) -> str:
        return text

    app = baseline.streamable_http_app(streamable_http_path="/mcp", json_response=json_response)
    logging.getLogger().setLevel(logging.WARNING)  # MCPServer turns on INFO logging of every request
    return app


def count(text: str) -> int:
    """A command-line count: a whole number >= 1 (argparse's one-line error otherwise)."""
    import argparse

    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= 1")
    return int(text)


def counts(text: str) -> list[int]:
    """A command-line list of counts ("1,8,32"), each as `count` takes it."""
    return [count(part) for part in text.split(",")]
