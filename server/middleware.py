"""Who may call the server and how much they may send, as pure ASGI
middleware. Starlette's @app.middleware("http") wraps `receive` so that
handlers never see http.disconnect; these pass it through untouched."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmctl.errors import AuthError, Forbidden, PayloadTooLarge
from llmctl.server.errors import error_response
from llmctl.server.state import HttpPolicy

_LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")


def _split_host(value: str) -> str:
    """The host of a Host header or origin netloc, lower-case, without port
    or IPv6 brackets."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" or host.endswith(".localhost") or (ip is not None and ip.is_loopback)


class OriginGuard:
    """Refuses (403) what a browser sends on behalf of another site.

    An Origin must be a loopback origin (any scheme and port) or match one of
    policy.allowed_origins (fnmatch patterns; "*" allows all). Requests with
    no Origin (curl, SDKs) pass. Against DNS rebinding, as Ollama does: on a
    connection that arrived at a loopback address, the Host header must name
    a loopback host, an IP literal that cannot be rebound (loopback, private,
    unspecified, link-local), this machine's hostname, the bound host, or the
    host of an allowed origin."""

    def __init__(self, app: ASGIApp, policy: HttpPolicy, bind_host: str | None = None):
        self.app = app
        self.patterns = tuple(o.strip().lower().rstrip("/") for o in policy.allowed_origins
                              if o.strip())
        names = {socket.gethostname().lower(), *(urlsplit(p).hostname or "" for p in self.patterns)}
        if bind_host:
            names.add(_split_host(bind_host))
        self.host_names = frozenset(n for n in names if n and "*" not in n)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            problem = self._problem(scope, Headers(scope=scope))
            if problem:
                await error_response(Forbidden(problem), scope["path"])(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def _problem(self, scope: Scope, headers: Headers) -> str | None:
        origin = headers.get("origin")
        if origin is not None and not self._origin_allowed(origin.strip().lower().rstrip("/")):
            return f"origin {origin!r} is not allowed (see --allowed-origins)"
        server = scope.get("server")
        if server and _is_loopback(str(server[0])):
            host = headers.get("host")
            if host is not None and not self._host_allowed(_split_host(host)):
                return f"host {host!r} is not allowed on a loopback server"
        return None

    def _origin_allowed(self, origin: str) -> bool:
        if any(fnmatchcase(origin, p) for p in self.patterns):
            return True
        try:
            return _split_host(urlsplit(origin).netloc) in _LOOPBACK_NAMES
        except ValueError:  # a malformed origin (bad port, stray bracket)
            return False

    def _host_allowed(self, host: str) -> bool:
        if not host or _is_loopback(host) or host in self.host_names or "*" in self.patterns:
            return True
        ip = _ip(host)
        return ip is not None and (ip.is_private or ip.is_unspecified or ip.is_link_local)


class AccessGuard:
    """The API key and the body cap.

    With policy.api_key set, every route but /health (and /metrics when
    policy.metrics_public) needs `Authorization: Bearer KEY`, else 401.
    A body over policy.max_body_bytes is a 413: at once when Content-Length
    says so, else when the streamed chunks pass the cap (the handler's read
    of the body raises PayloadTooLarge, so no more than the cap is kept)."""

    def __init__(self, app: ASGIApp, policy: HttpPolicy):
        self.app = app
        self.policy = policy
        self.open_paths = {"/health"} | ({"/metrics"} if policy.metrics_public else set())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = self._problem(scope, headers)
        if problem is not None:
            await error_response(problem, scope["path"])(scope, receive, send)
            return
        await self.app(scope, self._capped(receive), send)

    def _problem(self, scope: Scope, headers: Headers) -> AuthError | PayloadTooLarge | None:
        key = self.policy.api_key
        if key and scope["path"] not in self.open_paths:
            header = headers.get("authorization", "")
            token = header[7:].strip() if header[:7].lower() == "bearer " else ""
            if not secrets.compare_digest(token.encode(), key.encode()):
                return AuthError("invalid or missing API key")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.policy.max_body_bytes:
            return self._too_large()
        return None

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the server's limit of "
                               f"{self.policy.max_body_bytes} bytes (see --max-body-mb)")

    def _capped(self, receive: Receive) -> Receive:
        seen = 0

        async def receive_capped() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.policy.max_body_bytes:
                    raise self._too_large()
            return message   # http.disconnect included, as it came

        return receive_capped
