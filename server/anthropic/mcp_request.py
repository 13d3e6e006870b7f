"""Anthropic's MCP connector, read against the servers this server runs
(`serve --mcp`): `mcp_servers` entries name a configured server by `name`
(its `url` may only repeat the configured one), with the 2025-04-04
beta's `tool_configuration` or the later betas' `mcp_toolset` entries of
`tools` picking its tools. A request's own `authorization_token` is
refused by name: the operator's configuration holds the credentials."""

from __future__ import annotations

from typing import Any

from llmctl.errors import InvalidParams
from llmctl.server.hosted_tools import ServerAsk, ToolFilter, configured, same_url
from llmctl.tools.mcp_hub import McpHub

_SERVER_KEYS = frozenset({"type", "url", "name", "tool_configuration", "authorization_token"})
_TOOLSET_KEYS = frozenset({"type", "mcp_server_name", "default_config", "configs",
                           "cache_control"})


def _bad(where: str, what: str, param: str = "mcp_servers") -> InvalidParams:
    return InvalidParams(f"'{where}' {what}", param=param)


def _enabled(config: Any, where: str) -> bool:
    """A toolset's `enabled` (true unless it says false); defer_loading is refused."""
    if config is None:
        return True
    if not isinstance(config, dict) or set(config) - {"enabled", "defer_loading"}:
        raise _bad(where, "must be {\"enabled\": true|false}", "tools")
    if config.get("defer_loading") not in (None, False):
        raise _bad(f"{where}.defer_loading", "is not supported by llmctl (no tool search)",
                   "tools")
    if config.get("enabled") not in (None, True, False):
        raise _bad(f"{where}.enabled", "must be a boolean", "tools")
    return config.get("enabled") is not False


def _server(i: int, server: Any, hub: McpHub | None) -> tuple[str, ServerAsk | None]:
    where = f"mcp_servers[{i}]"
    if not isinstance(server, dict):
        raise _bad(where, "must be an object with a 'name'")
    for key in server:
        if key not in _SERVER_KEYS:
            raise _bad(f"{where}.{key[:40]}", "is not supported by llmctl")
    if server.get("authorization_token") not in (None, ""):
        raise _bad(f"{where}.authorization_token", "is refused: llmctl sends the configured "
                   "server's own credentials")
    if server.get("type", "url") != "url":
        raise _bad(f"{where}.type", "must be \"url\"")
    label = configured(hub, server.get("name"), f"{where}.name", "mcp_servers")
    assert hub is not None
    same_url(hub, label, server.get("url"), f"{where}.url", "mcp_servers")
    config = server.get("tool_configuration") or {}
    if not isinstance(config, dict) or set(config) - {"enabled", "allowed_tools"}:
        raise _bad(f"{where}.tool_configuration", "must be {\"enabled\", \"allowed_tools\"}")
    allowed = config.get("allowed_tools")
    if allowed is not None and not (isinstance(allowed, list)
                                    and all(isinstance(n, str) for n in allowed)):
        raise _bad(f"{where}.tool_configuration.allowed_tools", "must be a list of tool names")
    if config.get("enabled") is False:
        return label, None
    return label, ServerAsk(label, None if allowed is None else ToolFilter(frozenset(allowed)))


def _toolset(i: int, tool: dict, labels: set[str]) -> ServerAsk:
    where = f"tools[{i}]"
    for key in tool:
        if key not in _TOOLSET_KEYS:
            raise _bad(f"{where}.{key[:40]}", "is not supported by llmctl", "tools")
    label = tool.get("mcp_server_name")
    if label not in labels:
        raise _bad(f"{where}.mcp_server_name", "must name a server of mcp_servers", "tools")
    default = _enabled(tool.get("default_config"), f"{where}.default_config")
    configs = tool.get("configs") or {}
    if not isinstance(configs, dict):
        raise _bad(f"{where}.configs", "must map tool names to {\"enabled\": ...}", "tools")
    enabled = {name for name, c in configs.items() if _enabled(c, f"{where}.configs.{name[:40]}")}
    if default:
        return ServerAsk(label, None, denied=frozenset(set(configs) - enabled))
    return ServerAsk(label, ToolFilter(frozenset(enabled)))


def mcp_asks(body: dict, hub: McpHub | None) -> tuple[ServerAsk, ...]:
    """The servers a Messages body asks for, each with its tools. Raises
    InvalidParams naming the field: a server not configured here, another
    URL, credentials, a toolset for a server not in mcp_servers."""
    servers = body.get("mcp_servers")
    if servers is None:
        servers = []
    if not isinstance(servers, list):
        raise _bad("mcp_servers", "must be a list")
    asks: dict[str, ServerAsk | None] = {}
    for i, server in enumerate(servers):
        label, ask = _server(i, server, hub)
        if label in asks:
            raise _bad(f"mcp_servers[{i}].name", "names a server twice")
        asks[label] = ask
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and tool.get("type") == "mcp_toolset":
            # A toolset's configuration stands in for tool_configuration.
            asks[tool.get("mcp_server_name")] = _toolset(i, tool, set(asks))  # type: ignore[index]
    return tuple(a for a in asks.values() if a is not None)
