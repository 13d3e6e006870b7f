"""The Responses API's `mcp` tools, read against the servers this server
runs (`serve --mcp`): `server_label` names one, `allowed_tools` and
`require_approval` (a list of names or a filter on names and readOnlyHint)
pick its tools and the calls that wait for approval. A `server_url` other
than the configured one, a connector, or credentials of the request's own
are refused by name: a request never reaches what the operator did not
configure. Also the ids that tie an mcp_call or mcp_approval_request item
to the call in the conversation."""

from __future__ import annotations

from typing import Any

from llmctl.errors import InvalidParams
from llmctl.server.hosted_tools import ServerAsk, ToolFilter, configured, same_url
from llmctl.tools.mcp_hub import McpHub

_KEYS = frozenset({"type", "server_label", "server_url", "allowed_tools", "require_approval",
                   "server_description", "allowed_callers", "defer_loading"})
_REFUSED = {
    "connector_id": "connectors are not supported by llmctl; configure an MCP server instead",
    "headers": "llmctl sends the configured server's own headers",
    "authorization": "llmctl sends the configured server's own headers",
    "tunnel_id": "tunnels are not supported by llmctl; configure an MCP server instead",
}


def _filter(value: Any, where: str) -> ToolFilter:
    """A list of tool names, or {"tool_names": [...], "read_only": bool}."""
    if isinstance(value, list) and all(isinstance(n, str) for n in value):
        return ToolFilter(frozenset(value))
    if isinstance(value, dict) and not set(value) - {"tool_names", "read_only"}:
        names, read_only = value.get("tool_names"), value.get("read_only")
        if (names is None or isinstance(names, list) and all(isinstance(n, str) for n in names)) \
                and read_only in (None, True, False):
            return ToolFilter(None if names is None else frozenset(names), read_only)
    raise InvalidParams(f"'{where}' must be a list of tool names or {{\"tool_names\": [...], "
                        "\"read_only\": true|false}", param="tools")


def _approval(value: Any, where: str) -> tuple[ToolFilter, ToolFilter, bool]:
    """(always, never, ask by default) of `require_approval`; OpenAI's
    default asks before every call."""
    if value is None or value == "always":
        return ToolFilter(), ToolFilter(), True
    if value == "never":
        return ToolFilter(), ToolFilter(), False
    if isinstance(value, dict) and value and not set(value) - {"always", "never"}:
        always = _filter(value["always"], f"{where}.always") if "always" in value else ToolFilter()
        never = _filter(value["never"], f"{where}.never") if "never" in value else ToolFilter()
        return always, never, True
    raise InvalidParams(f"'{where}' must be \"always\", \"never\" or {{\"always\": filter, "
                        "\"never\": filter}", param="tools")


def mcp_ask(tool: dict, where: str, hub: McpHub | None) -> ServerAsk:
    """One `mcp` tool of a request. Raises InvalidParams naming the field:
    a server not configured here, another URL, a field llmctl refuses."""
    for key in tool:
        if key in _REFUSED and tool[key] not in (None, "", {}):
            raise InvalidParams(f"'{where}.{key}': {_REFUSED[key]}", param="tools")
        if key not in _KEYS and key not in _REFUSED:
            raise InvalidParams(f"'{where}.{key[:40]}' is not supported by llmctl", param="tools")
    label = configured(hub, tool.get("server_label"), f"{where}.server_label", "tools")
    assert hub is not None
    same_url(hub, label, tool.get("server_url"), f"{where}.server_url", "tools")
    if tool.get("defer_loading") not in (None, False):
        raise InvalidParams(f"'{where}.defer_loading': tool search is not supported by llmctl",
                            param="tools")
    if tool.get("allowed_callers") not in (None, ["direct"]):
        raise InvalidParams(f"'{where}.allowed_callers': only [\"direct\"] is supported by "
                            "llmctl", param="tools")
    allowed = tool.get("allowed_tools")
    always, never, default = _approval(tool.get("require_approval"), f"{where}.require_approval")
    return ServerAsk(label, None if allowed is None else _filter(allowed, f"{where}.allowed_tools"),
                     always, never, default)


def item_id(prefix: str, call_id: str) -> str:
    """The id of the mcp_call ("mcp") or mcp_approval_request ("mcpr") item
    of the call `call_id`: the call's own, so an approval finds its call."""
    return f"{prefix}_{call_id.removeprefix('call_')}"


def call_id_of(item: str) -> str:
    """The call id an mcp item's id stands for (item_id's inverse; an id
    this server did not make stands for itself)."""
    for prefix in ("mcpr_", "mcp_"):
        if item.startswith(prefix):
            return "call_" + item[len(prefix):]
    return item
