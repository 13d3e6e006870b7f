"""A small MCP server for the tests, written with the official SDK: run as
`toolbox.py stdio`, or `toolbox.py http PORT` for streamable HTTP on
loopback. Its tools: add (reads only), note (writes a line to a file, so a
yes is asked), hang (sleeps, for timeouts) and crash (the process exits)."""

from __future__ import annotations

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

server = MCPServer("toolbox")


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def add(a: int, b: int) -> str:
    """Add two whole numbers."""
    return str(a + b)


@server.tool()
def note(text: str) -> str:
    """Append a line of text to the notes file."""
    with open(os.environ.get("TOOLBOX_NOTES", os.devnull), "a") as f:
        f.write(text + "\n")
    return "noted"


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def hang(seconds: float) -> str:
    """Wait the given number of seconds, then say so."""
    time.sleep(seconds)
    return f"waited {seconds} s"


@server.tool()
def crash() -> str:
    """Stop the server at once."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
