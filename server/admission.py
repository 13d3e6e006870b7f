"""Admission: every request with a body waits its turn here, and only a
configured limit refuses one. Peers (llama-server, vLLM, Ollama) queue
bursts of thousands; so does this server.

A request holds a Ticket from the moment it arrives until its response is
done. It is *queued* until its generation holds an engine slot (or, for a
request that generates nothing, until it is answered). Queued requests are
bounded twice: by count (--max-queued) and by the memory they hold, their
bodies and what parsing and rendering make of them, counted as a fixed
charge per request plus a multiple of the body's bytes (--max-queued-mb).
Past either bound a new request gets a 503 with Retry-After in its
protocol's error shape; nothing else refuses a request for waiting.

The guard also owns the connection's receive channel once the body is
read: when the client leaves before its answer is done, the request's
handler is cancelled wherever it waits (a worker queue, a model's room,
the engine's queue), and what it held is released.

Everything here runs on the event loop's thread: no locks."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from llmctl.runtime.batching import SERVE_MAX_QUEUED
from llmctl.server.errors import error_response
from llmctl.server.workers import ServerBusy

if TYPE_CHECKING:
    from llmctl.runtime.llm import EventFeed

MB = 1 << 20
DEFAULT_MAX_QUEUED = SERVE_MAX_QUEUED
# The memory budget's default: 5% of the machine's RAM, within these bounds.
DEFAULT_MAX_QUEUED_MB = (256.0, 1024.0)
# What one queued request holds beyond its body: uvicorn's connection and
# parser, the ASGI scope and the middleware's frames, the handler's task,
# its engine sequence and stream. scripts/bench_burst.py's queue arm
# measures the server's RSS growth per queued short chat
# (docs/measurements.md, "Bursts"); this charge is at least that.
PER_REQUEST_BYTES = 48 << 10
# The body's bytes again as Python objects (parsed JSON, its validated
# form, the rendered prompt and its tokens): a parsed JSON string or
# dict costs several times its text.
PARSED_FACTOR = 4
# Where the scope carries a request's ticket for the handlers.
SCOPE_KEY = "llmctl.ticket"
# Only requests with a body are admitted: GETs (/health, /metrics, listings)
# never queue, so they answer at once under any burst.
_ADMITTED_METHODS = frozenset({"POST", "PUT", "PATCH"})


def default_queued_mb() -> float:
    """--max-queued-mb's default: 5% of this machine's RAM, at least 256
    MiB and at most 1 GiB (about 5,000 to 21,000 short requests)."""
    import psutil

    low, high = DEFAULT_MAX_QUEUED_MB
    return min(max(psutil.virtual_memory().total * 0.05 / MB, low), high)


def protocol_of(path: str) -> str:
    """The API a request's path belongs to, for the per-protocol counts."""
    if path.startswith("/v1/messages"):
        return "anthropic"
    if path.startswith("/v1/responses"):
        return "responses"
    if path.startswith("/api/"):
        return "ollama"
    return "openai" if path.startswith("/v1/") else "other"


@dataclass(eq=False)
class Ticket:
    """One admitted request."""

    protocol: str
    arrived: float = field(default_factory=time.monotonic)
    charge: int = PER_REQUEST_BYTES     # bytes counted against the budget while queued
    model: str | None = None            # once the request names (or defaults to) one
    feeds: list[EventFeed] = field(default_factory=list)  # its generation, once opened
    queued: bool = True

    def holds_slot(self) -> bool:
        """Whether its generation has left the engine's waiting queue."""
        return bool(self.feeds) and not all(s.waiting for s in self.feeds)


@dataclass(frozen=True)
class QueueView:
    """What /metrics, /stats and /api/ps show of the queue."""

    queued: int
    queued_bytes: int
    oldest_wait_s: float
    in_flight: int
    by_model: dict[str, int]
    by_protocol: dict[str, int]
    refused: int
    max_queued: int
    max_queued_bytes: int

    def as_dict(self) -> dict[str, Any]:
        return {"queued": self.queued, "queued_bytes": self.queued_bytes,
                "oldest_wait_s": round(self.oldest_wait_s, 3), "in_flight": self.in_flight,
                "by_model": self.by_model, "by_protocol": self.by_protocol,
                "refused": self.refused, "max_queued": self.max_queued,
                "max_queued_bytes": self.max_queued_bytes}


class Admission:
    """The server's queue bounds and the tickets in flight, oldest first."""

    def __init__(self, max_queued: int = DEFAULT_MAX_QUEUED,
                 max_queued_bytes: int = int(DEFAULT_MAX_QUEUED_MB[0] * MB)):
        if max_queued < 1 or max_queued_bytes < PER_REQUEST_BYTES:
            raise ValueError("the queue must have room for one request")
        self.max_queued, self.max_queued_bytes = max_queued, max_queued_bytes
        # The engines' slots (ServerState sets it): that many requests in
        # flight run rather than wait.
        self.slots: Callable[[], int] = lambda: 0
        self._tickets: dict[Ticket, None] = {}      # insertion order is arrival order
        self.queued = 0
        self.queued_bytes = 0
        self.refused = 0

    @classmethod
    def from_flags(cls, max_queued: int | None = None,
                   max_queued_mb: float | None = None) -> "Admission":
        """The bounds given (serve's --max-queued and --max-queued-mb, or
        their variables, which click reads), else the defaults."""
        count = max_queued or DEFAULT_MAX_QUEUED
        mb = max_queued_mb or default_queued_mb()
        return cls(count, max(int(mb * MB), PER_REQUEST_BYTES))

    def admit(self, protocol: str) -> Ticket:
        """A ticket for a new request. Raises ServerBusy when --max-queued
        requests wait already beyond those the engines' slots run, or the
        fixed charge would pass the byte budget."""
        waiting = len(self._tickets) - self.slots()
        if waiting >= self.max_queued:
            self.refused += 1
            raise ServerBusy(f"the server is busy: {waiting} requests wait beyond the running "
                             f"ones, its limit (--max-queued {self.max_queued}); retry shortly")
        ticket = Ticket(protocol)
        self._charge(ticket, 0)
        self._tickets[ticket] = None
        self.queued += 1
        return ticket

    def grow(self, ticket: Ticket, body_bytes: int) -> None:
        """Count `body_bytes` more of the ticket's body. Raises ServerBusy
        past the byte budget (the ticket stays admitted: release it)."""
        if body_bytes > 0:
            self._charge(ticket, PARSED_FACTOR * body_bytes)

    @staticmethod
    def charge_for(body_bytes: int) -> int:
        """What one queued request with a body of `body_bytes` counts."""
        return PER_REQUEST_BYTES + PARSED_FACTOR * body_bytes

    def _charge(self, ticket: Ticket, extra: int) -> None:
        more = ticket.charge if extra == 0 else extra
        if self.queued_bytes + more > self.max_queued_bytes:
            self._sweep()
            if self.queued_bytes + more > self.max_queued_bytes:
                self.refused += 1
                raise ServerBusy(f"the server is busy: its queued requests hold "
                                 f"{self.queued_bytes / MB:.0f} MiB, its limit (--max-queued-mb "
                                 f"{self.max_queued_bytes / MB:g}); retry shortly")
        if extra:
            ticket.charge += extra
        self.queued_bytes += more

    def start(self, ticket: Ticket) -> None:
        """The ticket's request leaves the queue: it runs (or is answered)."""
        if ticket.queued:
            ticket.queued = False
            self.queued -= 1
            self.queued_bytes -= ticket.charge

    def release(self, ticket: Ticket) -> None:
        """The request is done, answered or gone."""
        self.start(ticket)
        self._tickets.pop(ticket, None)

    def _sweep(self) -> None:
        """Move the tickets whose generation holds a slot out of the queue.
        Engines take requests on their own thread; this looks only when a
        bound is near, or for a view."""
        for ticket in self._tickets:
            if ticket.queued and ticket.holds_slot():
                self.start(ticket)

    def view(self) -> QueueView:
        self._sweep()
        now = time.monotonic()
        queued = [t for t in self._tickets if t.queued]
        by_model = Counter(t.model or "" for t in queued)
        return QueueView(len(queued), self.queued_bytes,
                         now - queued[0].arrived if queued else 0.0, len(self._tickets),
                         dict(by_model), dict(Counter(t.protocol for t in queued)),
                         self.refused, self.max_queued, self.max_queued_bytes)


def ticket_of(scope: Scope) -> Ticket | None:
    """The request's ticket; None where no admission runs (a library app)."""
    return scope.get(SCOPE_KEY)


class AdmissionGuard:
    """ASGI middleware: admits each request with a body, reads the body
    (counting it against the budget), then runs the app with the body
    replayed and the client watched. Refusals are answered in the route's
    error shape, after the body is drained unread, so that the client
    reads the answer rather than a reset connection; a client that leaves
    cancels its handler."""

    def __init__(self, app: ASGIApp, admission: Admission):
        self.app, self.admission = app, admission

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _ADMITTED_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            ticket = self.admission.admit(protocol_of(scope["path"]))
        except ServerBusy as e:
            await _refuse(e, scope, receive, send)
            return
        try:
            await _Admitted(self, ticket, scope, receive, send).run()
        finally:
            self.admission.release(ticket)


async def _refuse(e: ServerBusy, scope: Scope, receive: Receive, send: Send) -> None:
    """Drain what is left of the body (the body cap bounds it; nothing is
    kept), then answer `e`."""
    message: Message = {"more_body": True}
    while message.get("more_body", False):
        message = await receive()
        if message["type"] == "http.disconnect":
            return
    await error_response(e, scope["path"])(scope, receive, send)


def _declared(scope: Scope) -> int:
    """The body's Content-Length, 0 when absent or not a number."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length" and value.isdigit():
            return int(value)
    return 0


class _Admitted:
    """One admitted request: its body, its watcher and its handler."""

    def __init__(self, guard: AdmissionGuard, ticket: Ticket, scope: Scope, receive: Receive,
                 send: Send):
        self.guard, self.ticket, self._receive, self._send = guard, ticket, receive, send
        self.scope = {**scope, SCOPE_KEY: ticket}
        self.body: bytes | None = None
        self.gone = asyncio.Event()
        self.answered = False       # the response's last byte went out
        self.running = False        # the app is being awaited
        self.cancelled = False      # ... and we cancelled it: the client left

    async def run(self) -> None:
        try:
            chunks = await self._read()
        except ServerBusy as e:
            await _refuse(e, self.scope, self._receive, self._send)
            return
        if chunks is None:
            return                  # the client left mid-body (or the body cap answered)
        self.body = b"".join(chunks)
        task = asyncio.current_task()
        assert task is not None
        watcher = asyncio.create_task(self._watch(task))
        self.running = True
        try:
            await self.guard.app(self.scope, self.receive, self.send)
        except asyncio.CancelledError:
            # Ours: the client left, nobody reads an answer. Anyone else's
            # (the server shutting down) goes on up.
            if not self.cancelled or task.uncancel() > 0:
                raise
        finally:
            self.running = False
            watcher.cancel()

    async def _read(self) -> list[bytes] | None:
        """The body's chunks; None when the client left. A declared length
        is charged before any byte is read; more than it, as it comes."""
        counted = _declared(self.scope)
        self.guard.admission.grow(self.ticket, counted)
        seen, chunks = 0, []
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            if chunk:
                seen += len(chunk)
                if seen > counted:
                    self.guard.admission.grow(self.ticket, seen - counted)
                    counted = seen
                chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks

    async def _watch(self, task: asyncio.Task) -> None:
        while (await self._receive())["type"] != "http.disconnect":
            pass
        self.gone.set()             # the app's own receive() reports it too

        def cancel() -> None:
            if self.running and not self.answered:
                self.cancelled = True
                task.cancel()

        # Soon, not now: the app's own watchers wake on `gone` first.
        asyncio.get_running_loop().call_soon(cancel)

    async def receive(self) -> Message:
        """The body once, then what the watcher sees: a disconnect."""
        if self.body is not None:
            body, self.body = self.body, None
            return {"type": "http.request", "body": body, "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.answered = True
        await self._send(message)
