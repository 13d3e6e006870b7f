"""`llmctl mcp ls`: the configured MCP servers and their tools; and what
`run --mcp` and `chat --mcp` share: the options, loading the servers, and
the terminal's view of a tool loop (each call shown, a yes asked before a
tool that may change something, each result shown in short)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer
from rich.markup import escape
from typing_extensions import Annotated

from llmctl.cli import options as o
from llmctl.cli.common import err, handle_errors, out, print_json
from llmctl.cli.tables import fitted
from llmctl.errors import UsageError

if TYPE_CHECKING:
    from llmctl.tools.agent import Route
    from llmctl.tools.mcp_config import McpServer
    from llmctl.tools.mcp_hub import McpHub, McpOutcome

McpOpt = Annotated[Optional[Path], typer.Option(
    "--mcp", envvar="LLMCTL_MCP", show_default=False,
    help="MCP servers whose tools the model may call: a JSON file with \"mcpServers\" (as "
         "Claude Desktop, Cursor and LM Studio write it), added to the config file's "
         "[mcp.servers.NAME] tables (docs/mcp.md).")]
YesOpt = Annotated[bool, typer.Option(
    "--yes", "-y", help="Run every tool call without asking (read-only tools never ask).")]
MaxStepsOpt = Annotated[int, typer.Option(
    "--max-steps", min=1, max=64, help="Tool calls one answer may make.")]
SHOWN = 160         # characters of a call's arguments or result shown


def require_sdk() -> None:
    """Raise UsageError naming the extra when the MCP SDK is not installed."""
    from llmctl.extras import require

    require("mcp")


def servers_for(path: Path | None, *, required: bool) -> dict[str, McpServer]:
    """The servers `--mcp PATH` and the config file configure. Raises
    UsageError for a bad file, for none at all when `required`, and when
    the SDK is missing."""
    from llmctl.tools.mcp_config import load_servers

    servers = load_servers(path)
    if required and not servers:
        raise UsageError("no MCP servers are configured: give --mcp FILE, or add "
                         "[mcp.servers.NAME] tables to the config file")
    if servers:
        require_sdk()
    return servers


def short(text: str) -> str:
    one = " ".join(text.split())
    return one if len(one) <= SHOWN else one[:SHOWN - 1] + "…"


class TerminalWatcher:
    """Shows a tool loop on stderr and asks there (a yes from the
    terminal); answer text goes to `on_text`. Without a terminal to ask
    on, a call that needs a yes is declined (use --yes)."""

    def __init__(self, on_text: Any):
        self.text = on_text

    def call(self, route: Route | None, name: str, arguments: dict) -> None:
        import json

        where = f"{route.tool.server}." if route else ""
        err.print(f"\n[bold]→ {where}{name}[/]", short(json.dumps(arguments)), markup=True,
                  highlight=False)

    def approve(self, route: Route, arguments: dict) -> bool:
        if not sys.stdin.isatty():
            err.print(f"  {route.tool.name} may change something: not run without a yes "
                      "(no terminal to ask; --yes runs every call)")
            return False
        return typer.confirm(f"  run {route.tool.server}.{route.tool.name}?", default=False,
                             err=True)

    def result(self, route: Route | None, outcome: McpOutcome) -> None:
        mark = "[red]✗[/]" if outcome.is_error else "←"
        err.print(f"  {mark}", short(outcome.text) or "(nothing)", highlight=False)


def tools_rows(hub: McpHub, servers: dict[str, McpServer]) -> list[dict]:
    """One row per server: where it runs, and its tools or why it failed."""
    from llmctl.tools.mcp_hub import McpError

    rows = []
    for label, server in servers.items():
        row: dict[str, Any] = {"server": label, "transport": server.transport,
                               "runs": server.where()}
        try:
            row["tools"] = [t.as_dict() for t in hub.tools(label)]
        except McpError as e:
            row["error"] = str(e)
        rows.append(row)
    return rows


@handle_errors
def ls(mcp: McpOpt = None, json: o.Json = False) -> None:
    """List the configured MCP servers and their tools.

    Each server is started to ask it, and stopped again.

    Example: llmctl mcp ls --mcp ~/.config/Claude/claude_desktop_config.json
    """
    from llmctl.tools.mcp_hub import McpHub

    servers = servers_for(mcp, required=False)
    hub = McpHub(servers)
    try:
        rows = tools_rows(hub, servers)
    finally:
        hub.close()
    if json:
        print_json(rows)
        return
    if not rows:
        out.print("No MCP servers are configured (--mcp FILE, or [mcp.servers.NAME] tables).")
        return
    cells = []
    for row in rows:
        if "error" in row:
            cells.append([row["server"], "", "", f"[red]{escape(row['error'])}[/]"])
        for t in row.get("tools", []):
            cells.append([row["server"], t["name"], "yes" if t["annotations"]["read_only"]
                          else "", escape(short(t["description"]))])
    out.print(fitted(("server", "tool", "reads only", "description"), cells, out,
                     whole=("server", "tool"), drops=("reads only",), box=None,
                     pad_edge=False))


def register(app: typer.Typer) -> None:
    group = typer.Typer(help="List MCP servers and the tools they give the model.\n\n"
                             "Example: llmctl mcp ls --mcp servers.json",
                        no_args_is_help=True)
    group.command("ls")(ls)
    app.add_typer(group, name="mcp")
