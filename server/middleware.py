"""Who may call the server and how much they may send, as pure ASGI
middleware: one policy (`layers`) that `llmctl serve` (`install`) and the
cluster's proxies and ingress (`guard`) apply alike. Starlette's
@app.middleware("http") wraps `receive` so that handlers never see
http.disconnect; these pass it through untouched."""

from __future__ import annotations

import ipaddress
import secrets
import socket
from fnmatch import fnmatchcase
from urllib.parse import urlsplit

from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmctl.errors import AuthError, Forbidden, PayloadTooLarge
from llmctl.server.errors import error_response
from llmctl.server.state import HttpPolicy
from llmctl.server.webui import PAGE_PATH, STATIC_PREFIX

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
    policy.metrics_public, and the chat page's `/` and /webui/static/* when
    policy.webui) needs `Authorization: Bearer KEY` or `x-api-key: KEY`,
    else 401.
    A body over policy.max_body_bytes is a 413: at once when Content-Length
    says so, else as soon as the streamed chunks pass the cap. The guard
    then answers the 413 itself and tells the app the client is gone
    (http.disconnect), so whoever reads the body (a handler, or a proxy's
    reader task that queues it) stops with no more than the cap kept, and
    the app's own later answer is dropped."""

    def __init__(self, app: ASGIApp, policy: HttpPolicy):
        self.app = app
        self.policy = policy
        self.open_paths = {"/health"} | ({"/metrics"} if policy.metrics_public else set())
        # A browser's navigation sends no key: the chat page and its files
        # load without one, and the page asks for it (its JSON calls need it).
        self.page_prefix = STATIC_PREFIX if policy.webui else None
        if policy.webui:
            self.open_paths.add(PAGE_PATH)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        problem = self._problem(scope, headers)
        if problem is not None:
            await error_response(problem, scope["path"])(scope, receive, send)
            return
        await _Capped(self, scope, receive, send).run()

    def _problem(self, scope: Scope, headers: Headers) -> AuthError | PayloadTooLarge | None:
        key = self.policy.api_key
        if key and not self._open(scope["path"]):
            header = headers.get("authorization", "")
            token = header[7:].strip() if header[:7].lower() == "bearer " else ""
            # Anthropic's clients send the key as x-api-key instead.
            token = token or headers.get("x-api-key", "").strip()
            if not secrets.compare_digest(token.encode(), key.encode()):
                return AuthError("invalid or missing API key")
        length = headers.get("content-length", "").strip()
        if length.isascii() and length.isdigit() and int(length) > self.policy.max_body_bytes:
            return self.too_large()
        return None

    def _open(self, path: str) -> bool:
        return path in self.open_paths or bool(self.page_prefix and path.startswith(self.page_prefix))

    def too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"the request body is over the server's limit of "
                               f"{self.policy.max_body_bytes} bytes (see --max-body-mb)")


class _Capped:
    """One request under AccessGuard's body cap: counts the chunks the app
    receives and, past the cap, answers 413 in the app's place."""

    def __init__(self, guard: AccessGuard, scope: Scope, receive: Receive, send: Send):
        self.guard, self.scope, self._receive, self._send = guard, scope, receive, send
        self.seen = 0
        self.started = False        # a response head has gone out
        self.refused = False        # the 413 is ours: the app's messages are dropped

    async def run(self) -> None:
        await self.guard.app(self.scope, self.receive, self.send)

    async def receive(self) -> Message:
        if self.refused:
            return {"type": "http.disconnect"}
        message = await self._receive()
        if message["type"] == "http.request":
            self.seen += len(message.get("body", b""))
            if self.seen > self.guard.policy.max_body_bytes:
                await self._refuse()
                return {"type": "http.disconnect"}
        return message   # http.disconnect included, as it came

    async def send(self, message: Message) -> None:
        if self.refused:
            return
        self.started = self.started or message["type"] == "http.response.start"
        await self._send(message)

    async def _refuse(self) -> None:
        # Set before the first await: the app may try to answer meanwhile.
        self.refused = True
        if not self.started:
            response = error_response(self.guard.too_large(), self.scope["path"])

            async def nothing() -> Message:
                return {"type": "http.disconnect"}

            await response(self.scope, nothing, self._send)


def layers(policy: HttpPolicy, bind_host: str | None = None) -> list[Middleware]:
    """The access policy as ASGI middleware, outermost first: foreign
    origins and rebound hosts are refused before anything else, CORS
    preflights (which carry no API key) are answered next, and only then
    are the key and the body size checked. `llmctl serve`, the cluster's
    HTTP proxies and its ingress all apply this one list."""
    return [Middleware(OriginGuard, policy=policy, bind_host=bind_host),
            # Every origin that reaches this layer passed OriginGuard.
            Middleware(CORSMiddleware, allow_origins=["*"], allow_methods=["*"],
                       allow_headers=["*"]),
            Middleware(AccessGuard, policy=policy)]


def install(app: Starlette, policy: HttpPolicy, bind_host: str | None = None) -> None:
    """Put `layers` on a Starlette/FastAPI app (the last added runs first)."""
    for layer in reversed(layers(policy, bind_host)):
        app.add_middleware(layer.cls, *layer.args, **layer.kwargs)


def guard(app: ASGIApp, policy: HttpPolicy, bind_host: str | None = None) -> ASGIApp:
    """Any ASGI app wrapped in `layers`: what reaches `app` passed them all.
    Refusals are answered in the route's error shape (OpenAI's, or Ollama's
    on /api/*); nothing is raised."""
    for layer in reversed(layers(policy, bind_host)):
        app = layer.cls(app, *layer.args, **layer.kwargs)
    return app


def http_policy(api_key: str = "", allowed_origins: str = "", max_body_mb: float = 8.0,
                metrics_public: bool = False) -> HttpPolicy:
    """The policy that the --api-key, --allowed-origins (comma-separated),
    --max-body-mb and --metrics-public flags describe."""
    return HttpPolicy(api_key=api_key or None, metrics_public=metrics_public,
                      allowed_origins=tuple(o.strip() for o in allowed_origins.split(",")
                                            if o.strip()),
                      max_body_bytes=int(max_body_mb * (1 << 20)))
