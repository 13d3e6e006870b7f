"""MCP servers as people already configure them: a JSON file's `mcpServers`
(Claude Desktop, Cursor and LM Studio write it; VS Code's `servers` reads
the same), or the config file's `[mcp.servers.NAME]` tables.

    {"mcpServers": {
        "files": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem",
                                            "/home/me/notes"]},
        "search": {"url": "http://127.0.0.1:9000/mcp", "headers": {"Authorization": "..."}}}}

A server runs a `command` (stdio) or is reached at a `url` (streamable
HTTP). These are the only processes and addresses llmctl's MCP client ever
starts or reaches: requests name servers by their label alone. Every
mistake is one line naming the file and the key."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from llmctl.config_file import ConfigFile, load_config
from llmctl.errors import UsageError

# A label is what requests, the model's tool names and the CLI print: short
# and plain.
_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}")
MCP_TABLE = ("mcp", "servers")
DEFAULT_TIMEOUT_S = 60.0
_KEYS = {"command", "args", "env", "cwd", "url", "headers", "type", "timeout", "allowed-tools",
         "description"}


@dataclass(frozen=True)
class McpServer:
    """One configured server: a command to run over stdio, or a URL."""

    label: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = DEFAULT_TIMEOUT_S         # one tool call's bound
    allowed_tools: tuple[str, ...] | None = None  # None: all it lists
    description: str = ""

    @property
    def transport(self) -> str:
        return "stdio" if self.command else "http"

    def where(self) -> str:
        """What it runs or reaches, for listings."""
        return " ".join((self.command or "", *self.args)) if self.command else str(self.url)


def _fail(where: str, key: str, reason: str) -> UsageError:
    return UsageError(f"{where}: {key}: {reason}")


def _strings(value: Any, where: str, key: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise _fail(where, key, "must be a list of strings")
    return tuple(value)


def _string_map(value: Any, where: str, key: str) -> dict[str, str]:
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                              for k, v in value.items()):
        raise _fail(where, key, "must map names to strings")
    return dict(value)


def server_from(label: str, spec: Any, where: str) -> McpServer:
    """One server's entry, checked. Raises UsageError naming `where` and the key."""
    key = f"{label}"
    if not _LABEL.fullmatch(label):
        raise _fail(where, key, "a server's name must be letters, digits, '-' or '_' "
                                "(at most 48)")
    if not isinstance(spec, dict):
        raise _fail(where, key, "must be an object")
    fields = {k.replace("_", "-") if "_" in k else k: v for k, v in spec.items()}
    fields = {("allowed-tools" if k == "allowedTools" else k): v for k, v in fields.items()}
    unknown = sorted(set(fields) - _KEYS)
    if unknown:
        raise _fail(where, f"{key}.{unknown[0]}", "not a setting llmctl knows (use command, "
                                                  "args, env, cwd, url, headers, timeout)")
    command, url = fields.get("command"), fields.get("url")
    if (command is None) == (url is None):
        raise _fail(where, key, "needs a `command` (stdio) or a `url` (streamable HTTP), "
                                "not both")
    if command is not None and (not isinstance(command, str) or not command.strip()):
        raise _fail(where, f"{key}.command", "must be a program to run")
    if url is not None:
        parts = urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise _fail(where, f"{key}.url", "must be an http:// or https:// URL")
    kind = fields.get("type")
    if kind not in (None, "stdio", "http", "streamable-http", "streamableHttp"):
        raise _fail(where, f"{key}.type", f"{kind!r} is not a transport llmctl speaks "
                                          "(stdio, or streamable HTTP)")
    timeout = fields.get("timeout", DEFAULT_TIMEOUT_S)
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise _fail(where, f"{key}.timeout", "must be a positive number of seconds")
    allowed = fields.get("allowed-tools")
    return McpServer(
        label, command=command, url=url,
        args=_strings(fields.get("args", []), where, f"{key}.args"),
        env=_string_map(fields.get("env", {}), where, f"{key}.env"),
        cwd=fields["cwd"] if isinstance(fields.get("cwd"), str) else None,
        headers=_string_map(fields.get("headers", {}), where, f"{key}.headers"),
        timeout_s=float(timeout),
        allowed_tools=None if allowed is None else _strings(allowed, where,
                                                             f"{key}.allowedTools"),
        description=str(fields.get("description", "")))


def load_mcp_file(path: Path) -> dict[str, McpServer]:
    """The servers of a JSON file with `mcpServers` (or `servers`). Raises
    UsageError for a file that cannot be read, is not JSON, or has a bad
    entry."""
    try:
        data = json.loads(path.read_text())
    except OSError as e:
        raise UsageError(f"{path}: cannot read the MCP configuration: "
                         f"{e.strerror or e}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"{path}: not JSON: {e}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: must be a JSON object with \"mcpServers\"")
    servers = data.get("mcpServers", data.get("servers"))
    if not isinstance(servers, dict):
        raise UsageError(f"{path}: has no \"mcpServers\" object")
    return {label: server_from(label, spec, f"{path}: mcpServers") for label, spec in
            servers.items()}


def config_servers(config: ConfigFile) -> dict[str, McpServer]:
    """The config file's `[mcp.servers.NAME]` tables. Raises ConfigError
    (a UsageError) naming the file, line and key."""
    out = {}
    for table, settings in config.tables.items():
        if table[:2] != MCP_TABLE:
            continue
        if len(table) != 3:
            key = next(iter(settings))
            raise config.error(table, key, "servers go in [mcp.servers.NAME] tables")
        label = table[2]
        line = config.headers.get(table, 1)
        spec = {key: s.value for key, s in settings.items()}
        out[label] = server_from(label, spec, f"{config.path}:{line}: mcp.servers")
    return out


def load_servers(path: Path | None, config: ConfigFile | None = None) -> dict[str, McpServer]:
    """The servers in effect: the config file's, then `path`'s over them
    (the file given with --mcp wins for a label both name)."""
    servers = config_servers(config if config is not None else load_config())
    if path is not None:
        servers.update(load_mcp_file(path))
    return servers
