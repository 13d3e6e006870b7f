"""The MCP client of one llmctl process, on the official `mcp` SDK: each
configured server is started on first use (a process for a `command`, a
connection for a `url`) and stopped with the hub. Every call is bounded:
its server's timeout, a cap on the result's size, and cancellation when
the caller stops waiting. A server that dies is restarted once; if it dies
again, calls to it fail with a clear error and the rest go on.

The sessions live on one thread of their own with an asyncio loop, so the
terminal chat (plain threads) and the server (its own event loop) use the
same hub: `tools` and `call` block, `tools_async` and `call_async` await."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import threading
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Awaitable, TypeVar

from llmctl.errors import LlmctlError
from llmctl.tools.mcp_config import McpServer

T = TypeVar("T")
RESULT_CAP = 64 << 10           # characters of a tool's result the model sees
# JSON-RPC codes (mcp_types'): the connection closed; a request timed out.
CONNECTION_CLOSED, REQUEST_TIMEOUT = -32000, -32001
_LIST_TIMEOUT_S = 60.0          # starting a server and listing its tools


class McpError(LlmctlError):
    """An MCP server could not be reached, started or listed."""

    http_status = 502
    code = "mcp_server_error"


@dataclass(frozen=True)
class McpTool:
    """A tool a server offers: its name, description, input schema, and
    whether it says it only reads (MCP's readOnlyHint)."""

    server: str
    name: str
    description: str
    input_schema: dict
    read_only: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema,
                "annotations": {"read_only": self.read_only}}


@dataclass(frozen=True)
class McpOutcome:
    """A tool call's result as text for the model, and whether it failed
    (the tool said so, timed out, or its server is gone)."""

    text: str
    is_error: bool = False


class _Session:
    """One server's connection, made on first use."""

    def __init__(self, server: McpServer):
        self.server = server
        self.client: Any = None
        self.stack: contextlib.AsyncExitStack | None = None
        self.restarted = False
        self.dead: str | None = None
        self.errlog = tempfile.TemporaryFile("w+", prefix=f"llmctl-mcp-{server.label}-")

    async def open(self) -> Any:
        if self.client is not None:
            return self.client
        if self.dead is not None:
            raise McpError(self.dead)
        from mcp import Client

        stack = contextlib.AsyncExitStack()
        try:
            client = Client(self._transport(), read_timeout_seconds=self.server.timeout_s)
            self.client = await stack.enter_async_context(client)
        except BaseException as e:
            await stack.aclose()
            raise McpError(f"MCP server {self.server.label!r} did not start: "
                           f"{self._why(e)}") from None
        self.stack = stack
        return self.client

    def _transport(self) -> Any:
        from mcp.client.stdio import StdioServerParameters, stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from mcp.shared._httpx_utils import create_mcp_http_client

        s = self.server
        if s.command is not None:
            return stdio_client(StdioServerParameters(command=s.command, args=list(s.args),
                                                      env=s.env or None, cwd=s.cwd),
                                errlog=self.errlog)
        assert s.url is not None
        return streamable_http_client(s.url, http_client=create_mcp_http_client(
            headers=s.headers or None))

    def _why(self, e: BaseException) -> str:
        """The error, and the last line the server wrote to its stderr."""
        why = str(e).strip() or type(e).__name__
        with contextlib.suppress(OSError, ValueError):
            self.errlog.seek(0)
            lines = [line.strip() for line in self.errlog.read().splitlines() if line.strip()]
            if lines:
                why += f" (it said: {lines[-1][:200]})"
        return why[:400]

    async def close(self) -> None:
        stack, self.stack, self.client = self.stack, None, None
        if stack is not None:
            with contextlib.suppress(BaseException):
                await stack.aclose()

    async def lost(self, e: BaseException) -> None:
        """The connection failed under a call: close it; the next use
        starts the server again, once."""
        await self.close()
        if self.restarted:
            self.dead = (f"MCP server {self.server.label!r} stopped again after a restart: "
                         f"{self._why(e)}")
        self.restarted = True


class McpHub:
    """The configured `servers`, by label, started when first used."""

    def __init__(self, servers: dict[str, McpServer], result_cap: int = RESULT_CAP):
        self.servers = servers
        self.result_cap = result_cap
        self._sessions = {label: _Session(s) for label, s in servers.items()}
        self._tools: dict[str, list[McpTool]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()

    # ---- the hub's own thread ------------------------------------------------

    def _submit(self, coro: Awaitable[T]) -> Future[T]:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="llmctl-mcp", daemon=True).start()
                self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)  # type: ignore[arg-type]

    def _session(self, label: str) -> _Session:
        session = self._sessions.get(label)
        if session is None:
            raise McpError(f"no MCP server is configured as {label!r}")
        return session

    async def _tools_of(self, label: str) -> list[McpTool]:
        if label in self._tools:
            return self._tools[label]
        session = self._session(label)
        try:
            async with asyncio.timeout(_LIST_TIMEOUT_S):
                client = await session.open()
                listed, cursor = [], None
                while True:
                    page = await client.list_tools(cursor=cursor)
                    listed += page.tools
                    cursor = page.next_cursor
                    if not cursor:
                        break
        except McpError:
            raise
        except BaseException as e:
            await session.lost(e)
            raise McpError(f"MCP server {label!r} could not list its tools: "
                           f"{session._why(e)}") from None
        allowed = session.server.allowed_tools
        tools = [McpTool(label, t.name, t.description or "", dict(t.input_schema or {}),
                         bool(t.annotations and t.annotations.read_only_hint))
                 for t in listed if allowed is None or t.name in allowed]
        self._tools[label] = tools
        return tools

    async def _call(self, label: str, name: str, arguments: dict) -> McpOutcome:
        """One call, never retried (a tool may change something): a server
        that dies under it is started again for the next call, once."""
        session = self._session(label)
        timeout = session.server.timeout_s
        try:
            client = await session.open()
        except McpError as e:
            return McpOutcome(f"error: {e}", is_error=True)
        try:
            async with asyncio.timeout(timeout):
                result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
            return self._outcome(result)
        except asyncio.CancelledError:
            raise
        except BaseException as e:
            if isinstance(e, TimeoutError) or _code(e) == REQUEST_TIMEOUT:
                return McpOutcome(f"error: the tool {name!r} timed out after {timeout:g} s",
                                  is_error=True)
            if _code(e) not in (None, CONNECTION_CLOSED):   # the server answered: it lives
                return McpOutcome(f"error: {e}"[: self.result_cap], is_error=True)
            why = session._why(e)
            await session.lost(e)
            then = ("it is started again for the next call" if session.dead is None
                    else "it had been restarted once already, and stays stopped")
            return McpOutcome(f"error: MCP server {label!r} stopped during the call ({why}); "
                              f"{then}", is_error=True)

    def _outcome(self, result: Any) -> McpOutcome:
        parts = []
        for block in result.content or []:
            text = getattr(block, "text", None)
            parts.append(text if isinstance(text, str) else f"[{getattr(block, 'type', '?')}]")
        if not parts and result.structured_content is not None:
            parts.append(str(result.structured_content))
        text = "\n".join(parts)
        if len(text) > self.result_cap:
            text = text[: self.result_cap] + f"\n[... cut at {self.result_cap} characters]"
        return McpOutcome(text, bool(result.is_error))

    # ---- any thread ------------------------------------------------------------

    def tools(self, label: str) -> list[McpTool]:
        """The server's tools, starting it if need be. Raises McpError."""
        return self._submit(self._tools_of(label)).result()

    def all_tools(self) -> list[McpTool]:
        """Every configured server's tools. Raises McpError for the first
        server that fails."""
        return [t for label in self.servers for t in self.tools(label)]

    def call(self, label: str, name: str, arguments: dict) -> McpOutcome:
        """Run one tool call; a failure is an outcome, not an exception
        (McpError only for a label that is not configured)."""
        future = self._submit(self._call(label, name, arguments))
        try:
            return future.result()
        except BaseException:
            future.cancel()     # the caller left (Ctrl-C): stop waiting on the tool
            raise

    async def tools_async(self, label: str) -> list[McpTool]:
        return await asyncio.wrap_future(self._submit(self._tools_of(label)))

    async def call_async(self, label: str, name: str, arguments: dict) -> McpOutcome:
        """call(), awaited; cancelling the awaiting task cancels the call."""
        return await asyncio.wrap_future(self._submit(self._call(label, name, arguments)))

    def close(self) -> None:
        """Stop every server this hub started, and its thread."""
        with self._lock:
            loop, self._loop = self._loop, None
        if loop is None:
            return

        async def stop() -> None:
            for session in self._sessions.values():
                await session.close()

        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=15)
        loop.call_soon_threadsafe(loop.stop)


def _code(e: BaseException) -> int | None:
    """The JSON-RPC error code of an error the server (or the SDK for it)
    answered with; None for any other failure."""
    from mcp.shared.exceptions import MCPError

    return e.code if isinstance(e, MCPError) else None
