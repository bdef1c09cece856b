"""A stdio MCP server for the tests, written with the SDK (``MCPServer``, mcp 1.x's FastMCP).

``python tests/support/mcp_server.py`` serves over stdio; ``--http PORT`` over streamable HTTP on
127.0.0.1. It prints ``mcp test server pid N`` to stderr at start (tests find the process by it).
"""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer

FLOOD_BYTES = 5 * 1024 * 1024

server = MCPServer("lazykv-test")


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@server.tool()
def hang() -> str:
    """Never answer."""
    while True:
        time.sleep(3600)


@server.tool()
def flood() -> str:
    """Answer about 5 MB of text."""
    return "x" * FLOOD_BYTES


@server.tool()
def fail() -> str:
    """Always fail."""
    raise RuntimeError("the fail tool failed, as it always does")


def main() -> None:
    print(f"mcp test server pid {os.getpid()}", file=sys.stderr, flush=True)
    if len(sys.argv) == 3 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()


if __name__ == "__main__":
    main()
