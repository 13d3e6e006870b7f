"""The cluster's one HTTP front: forwards every API request to a replica
(chosen by the router from the request's affinity key) and answers
/health, /metrics and /cluster/stats itself from the Board, where every
replica reports its engine's counters each second.

A replica lost mid-request (killed, its node gone) never hangs a client:
a request that has sent nothing yet is retried once on another replica;
after that, or once a stream has started, it ends with a retriable error
(503 + Retry-After as OpenAI's error JSON, or a final error event in a
stream whose 200 head is already out).

Every request passes llmctl serve's access policy (server/middleware.py:
the key, Origin and Host, the body cap) here, before anything is read or
forwarded; the cluster's HTTP proxies apply it too (cluster/policy.py)."""

from __future__ import annotations

import json
import logging
import time

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse

from llmctl.cluster import affinity
from llmctl.cluster.replica import REPORT_EVERY_S

log = logging.getLogger("llmctl.cluster")

STALE_AFTER_S = 3 * REPORT_EVERY_S    # a replica silent this long is gone
PIN_HEADER = "x-llmctl-replica"       # request: pin to a replica; response: who served
STREAM_HOLD = 2                       # stream chunks held back while a retry is still possible


class Board:
    """Each replica's latest report. Rows of replicas that are gone are kept,
    so the counters summed over them never go down."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}

    def report(self, replica: str, stats, health: str, pid: int) -> None:
        self.rows[replica] = {"stats": stats, "health": health, "pid": pid, "at": time.time()}

    def snapshot(self) -> dict[str, dict]:
        return self.rows


async def _parse(body: bytes, lane):
    """`body` parsed as llmctl serve parses it (server/body.py: a JSON
    object, depth-checked, finite; a large one on `lane`, the ingress's
    body workers and their deadline), so the ingress's loop keeps relaying
    streams meanwhile. Raises InvalidParams, and ServerBusy when those
    workers are too busy to start it."""
    from llmctl.server.body import parse_body

    return await parse_body(body, *lane)


async def _lifespan(receive, send) -> None:
    """ASGI lifespan: nothing to start or stop (Ray Serve runs it)."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def _lost_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import ActorUnavailableError, RayActorError

    return RayActorError, ActorUnavailableError


def _lost(why: str):
    from llmctl.errors import ReplicaLost

    return ReplicaLost(f"the replica serving this request was lost ({why}); retry it")


def lost_response(path: str, why: str) -> Response:
    """The retriable answer for a request whose replica was lost."""
    from llmctl.server.errors import error_response

    return error_response(_lost(why), path)


def _error_frame(content_type: str, why: str) -> bytes:
    """The last chunk of a stream cut by a lost replica, in the stream's own
    framing: SSE for OpenAI's routes, a JSON line for Ollama's."""
    from llmctl.server.errors import error_body

    e = _lost(why)
    if content_type.startswith("text/event-stream"):
        body = error_body(e.message, e.error_type, e.code)
        return f"data: {json.dumps(body)}\n\ndata: [DONE]\n\n".encode()
    return (json.dumps({"error": e.message}) + "\n").encode()


class Ingress:
    """A Ray Serve deployment class (wrapped by deploy.py in serve.ingress):
    its ASGI app is `__serve_build_asgi_app__`'s, built after __init__.
    Raises nothing of its own: failures become responses."""

    def __init__(self, replicas, board, policy=None, bind_host: str | None = None) -> None:
        from llmctl.server.body import body_lane
        from llmctl.server.state import HttpPolicy
        from llmctl.settings import Settings

        self.replicas = replicas.options(stream=True)
        # The ingress's own start-up, in its Ray process: a bad setting fails it.
        self._body_lane = body_lane(Settings.load())
        self.board = board
        self.policy = policy or HttpPolicy()
        self.bind_host = bind_host

    def __serve_build_asgi_app__(self):
        """The ingress's ASGI app: `_asgi` behind llmctl serve's policy."""
        from llmctl.server.middleware import guard

        return guard(self._asgi, self.policy, self.bind_host)

    async def _asgi(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return      # no websockets: the proxy closes the connection
        try:
            response = await self.answer(Request(scope, receive))
        except ClientDisconnect:
            return      # gone, or over the body cap (the policy answered 413)
        await response(scope, receive, send)

    async def answer(self, request: Request) -> Response:
        """The response to one request that passed the policy."""
        path = request.url.path
        if path == "/health":
            return await self._health()
        if path == "/metrics":
            return PlainTextResponse(await self._metrics(), media_type="text/plain; version=0.0.4")
        if path == "/cluster/stats":
            return JSONResponse(await self._stats())
        return await self._forward(request)

    async def _forward(self, request: Request) -> Response:
        from llmctl.errors import LlmctlError
        from llmctl.server.errors import error_response

        # The policy's cap bounds this read; past it, ClientDisconnect.
        body = await request.body()
        try:
            key = affinity.affinity_key(await _parse(body, self._body_lane)) if body else None
        except LlmctlError as e:     # InvalidParams (not JSON, too deep, not finite), ServerBusy
            return error_response(e, request.url.path)
        call = (request.method, request.url.path, request.url.query.encode(),
                list(request.headers.items()), body)
        pin = request.headers.get(PIN_HEADER)
        why = "no replica answered"
        for _ in range(2):
            gen = self.replicas.handle.remote(*call, affinity=key, pin=pin)
            try:
                return await self._respond(gen)
            except _lost_errors() as e:
                why = type(e).__name__
                log.warning("replica lost before answering %s: %s", request.url.path, e)
        return lost_response(request.url.path, why)

    async def _respond(self, gen) -> Response:
        """The response of one replica call. Raises the lost-replica errors
        while nothing has been sent to the client, so the caller may retry."""
        head = await gen.__anext__()
        headers = {k: v for k, v in head["headers"] if k.lower() != "content-length"}
        headers[PIN_HEADER] = head["replica"]
        if "content-length" in {k.lower() for k, _ in head["headers"]}:
            # A whole response: nothing reaches the client until it is
            # complete, so a loss anywhere in it can still be retried.
            return Response(b"".join([chunk async for chunk in gen]), head["status"], headers)
        # A stream sends its head and first frame (the role) before the
        # request leaves the engine's queue; holding them until a second
        # frame (the first token) arrives keeps a queued request retriable.
        held = []
        async for chunk in gen:
            held.append(chunk)
            if len(held) == STREAM_HOLD:
                break
        return StreamingResponse(self._relay(held, gen, headers.get("content-type", "")),
                                 head["status"], headers)

    async def _relay(self, held: list[bytes], gen, content_type: str):
        for chunk in held:
            yield chunk
        try:
            async for chunk in gen:
                yield chunk
        except _lost_errors() as e:
            log.warning("replica lost mid-stream: %s", e)
            yield _error_frame(content_type, type(e).__name__)
        finally:
            # A client gone mid-stream: the replica's app sees a disconnect
            # and cancels the generation (a no-op after the end).
            gen.cancel()

    async def _rows(self) -> dict[str, dict]:
        rows = await self.board.snapshot.remote()
        now = time.time()
        for row in rows.values():
            row["live"] = now - row["at"] <= STALE_AFTER_S
        return rows

    async def _health(self) -> JSONResponse:
        rows = await self._rows()
        replicas = {rid: ("ok" if r["health"] == "ok" else r["health"]) if r["live"] else "gone"
                    for rid, r in rows.items()}
        up = sum(v == "ok" for v in replicas.values())
        status = "ok" if up else "unavailable"
        return JSONResponse({"status": status, "replicas_up": up, "replicas": replicas},
                            status_code=200 if up else 503)

    async def _stats(self) -> dict:
        rows = await self._rows()
        per = {}
        for rid, r in rows.items():
            s = r["stats"]
            per[rid] = {"live": r["live"], "health": r["health"], "pid": r["pid"],
                        "hit_rate": round(s.cached_tokens / s.prompt_tokens, 4) if s.prompt_tokens
                        else 0.0, **s.as_dict()}
        return {"replicas": per, "routing": dict(affinity.DECISIONS)}

    async def _metrics(self) -> str:
        from llmctl.runtime.engine.stats import combine
        from llmctl.server.metrics import render

        rows = await self._rows()
        live = [r for r in rows.values() if r["live"]]
        text = render(combine([r["stats"] for r in rows.values()]), len(live))
        lines = ["# TYPE llmctl_replica_up gauge"]
        lines += [f'llmctl_replica_up{{replica="{rid}"}} {int(r["live"] and r["health"] == "ok")}'
                  for rid, r in rows.items()]
        for name, attr in (("prompt_tokens_total", "prompt_tokens"),
                           ("prefix_cache_hit_tokens_total", "cached_tokens"),
                           ("prefix_cache_disk_hit_tokens_total", "cached_tokens_disk")):
            lines.append(f"# TYPE llmctl_replica_{name} counter")
            lines += [f'llmctl_replica_{name}{{replica="{rid}"}} {getattr(r["stats"], attr)}'
                      for rid, r in rows.items()]
        lines.append("# TYPE llmctl_router_decisions_total counter")
        lines += [f'llmctl_router_decisions_total{{decision="{k}"}} {v}'
                  for k, v in sorted(affinity.DECISIONS.items())]
        return text + "\n".join(lines) + "\n"
