"""MCP tools the server runs for a request (`serve --mcp FILE`): which of
the configured servers a request asks for (the Responses API's `mcp` tool,
Anthropic's `mcp_servers`), which of their tools it allows, which calls
need the client's approval first, and the tools listed as functions the
model sees.

A request names servers by label only. It can never start a process or
reach an address the operator did not configure: a label not configured,
a URL other than the configured one, or credentials of its own are
refused by name (a 400 in the protocol's shape)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.tool_schema import ToolChoice
from llmctl.server.tool_protocol import Structured
from llmctl.tools.agent import Route, function_tools, routes_of
from llmctl.tools.mcp_hub import McpError, McpHub, McpTool


class McpListFailed(McpError):
    """A server a request asked for could not list its tools (OpenAI's
    answer to this is a 424)."""

    http_status = 424
    code = "mcp_list_tools_failed"


@dataclass(frozen=True)
class ToolFilter:
    """Tools picked by name and/or by MCP's readOnlyHint; an empty filter
    (None, None) picks none."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def picks(self, tool: McpTool) -> bool:
        if self.names is None and self.read_only is None:
            return False
        return (self.names is None or tool.name in self.names) and \
            (self.read_only is None or tool.read_only == self.read_only)


@dataclass(frozen=True)
class ServerAsk:
    """One configured server a request asks for: the tools it allows
    (None: all the server offers) and the calls that wait for approval."""

    label: str
    allowed: ToolFilter | None = None
    always: ToolFilter = ToolFilter()      # approval asked for these
    never: ToolFilter = ToolFilter()       # ... and not for these
    ask_by_default: bool = False           # for a tool neither filter picks
    denied: frozenset[str] = frozenset()   # tools left out by name

    def allows(self, tool: McpTool) -> bool:
        return (self.allowed is None or self.allowed.picks(tool)) and tool.name not in self.denied

    def needs_approval(self, tool: McpTool) -> bool:
        if self.never.picks(tool):
            return False
        return self.always.picks(tool) or self.ask_by_default


def configured(hub: McpHub | None, label: object, where: str, param: str) -> str:
    """`label` when it names a server of this server's configuration.
    Raises InvalidParams naming `where` otherwise."""
    if not isinstance(label, str) or not label:
        raise InvalidParams(f"'{where}' must name an MCP server configured on this server",
                            param=param)
    if hub is None:
        raise InvalidParams(f"'{where}': this server runs no MCP servers (start it with "
                            "`llmctl serve --mcp FILE`)", param=param)
    if label not in hub.servers:
        known = ", ".join(sorted(hub.servers)) or "none"
        raise InvalidParams(f"'{where}': {label[:64]!r} is not an MCP server configured on "
                            f"this server (configured: {known})", param=param)
    return label


def same_url(hub: McpHub, label: str, url: object, where: str, param: str) -> None:
    """A request may repeat a configured server's URL, never give another:
    raises InvalidParams for any other URL, or any URL for a server that
    is run as a process."""
    if url in (None, ""):
        return
    if url != hub.servers[label].url:
        raise InvalidParams(f"'{where}': llmctl reaches only the MCP servers its operator "
                            f"configured; name the server by its label alone", param=param)


@dataclass
class HostedTools:
    """The tools of the servers a request asked for, listed: the functions
    the model sees and the route of each to its server's tool."""

    hub: McpHub
    asks: dict[str, ServerAsk]
    listed: dict[str, list[McpTool]] = field(default_factory=dict)   # label -> allowed tools
    routes: dict[str, Route] = field(default_factory=dict)

    def route(self, function: str) -> Route | None:
        return self.routes.get(function)

    def find(self, label: str | None, tool: str) -> Route | None:
        """The route to server `label`'s tool `tool`."""
        return next((r for r in self.routes.values()
                     if r.tool.server == label and r.tool.name == tool), None)

    def needs_approval(self, route: Route) -> bool:
        return self.asks[route.tool.server].needs_approval(route.tool)

    def merged(self, structured: Structured, choice: str | None) -> Structured:
        """`structured` with these tools offered beside the request's own.
        `choice` is the request's tool_choice: "required" where it asked
        for a call and has only these tools, "keep" for the one it gave,
        None for none given ("auto")."""
        tools = (structured.tools or []) + function_tools(self.routes)
        if choice == "required":
            picked = ToolChoice("required")
        elif choice == "keep" or structured.tools:
            picked = structured.choice
        else:
            picked = ToolChoice("auto")
        return replace(structured, tools=tools or None, choice=picked)


async def list_hosted(hub: McpHub, asks: list[ServerAsk], taken: set[str]) -> HostedTools:
    """The tools `asks` allow, each server started if need be; function
    names clash with no name in `taken` (the request's own functions).
    Raises McpListFailed naming the server that could not list them."""
    hosted = HostedTools(hub, {a.label: a for a in asks})
    for ask in asks:
        try:
            tools = await hub.tools_async(ask.label)
        except McpError as e:
            raise McpListFailed(f"MCP server {ask.label!r} could not list its tools: "
                                f"{e.message}") from None
        hosted.listed[ask.label] = [t for t in tools if ask.allows(t)]
    everything = [t for tools in hosted.listed.values() for t in tools]
    for name, route in routes_of(everything).items():
        if name in taken:
            name = f"{route.tool.server}__{route.tool.name}"[:64]
        hosted.routes[name] = Route(name, route.tool)
    return hosted
