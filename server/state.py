"""What the server knows between requests: the model pool, the default
model, the HTTP policy and the output options. Statistics live in the
engines (pool.stats())."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Awaitable

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from llmctl.errors import EngineFailed, InvalidParams, ModelLoading, ModelNotFound
from llmctl.runtime.pool import Lease, ModelPool, parse_keep_alive
from llmctl.runtime.sampling import SamplingParams


@dataclass(frozen=True)
class HttpPolicy:
    """Who may call the server and how much they may send."""

    api_key: str | None = None          # required on every route but /health
    metrics_public: bool = False        # /metrics without the key, for Prometheus
    allowed_origins: tuple[str, ...] = ()   # browser origins beyond localhost
    max_body_bytes: int = 8 << 20


@dataclass
class ServerState:
    pool: ModelPool
    default: str | None = None          # the model of a request that names none
    policy: HttpPolicy = field(default_factory=HttpPolicy)
    defaults: SamplingParams = field(default_factory=SamplingParams)
    reasoning_format: str = "auto"      # --reasoning-format; a request may name its own
    preloading: bool = False            # `serve MODEL` is loading MODEL
    load_error: str | None = None       # ... and it failed
    started: float = field(default_factory=time.time)

    @classmethod
    def serving(cls, llm, **kwargs) -> "ServerState":
        """A state whose pool holds `llm` (loaded by the caller) as the
        default model, for an app built around one LLM object."""
        pool = ModelPool(llm.opts, memory_budget=1 << 62)
        pool.adopt(llm.resolved, llm)
        return cls(pool, default=llm.name, **kwargs)

    async def lease(self, model: str | None, keep_alive=None) -> Lease:
        """A lease on the model a request names (the default when None),
        loaded if needed. `keep_alive` is the request's raw value. Raises
        InvalidParams for a bad keep_alive, ModelLoading when no model is
        named and none is the default, EngineFailed for a dead engine, and
        what ModelPool.acquire raises."""
        keep = request_keep_alive(keep_alive)
        name = model or self.default
        if name is None:
            raise ModelLoading("no model is named in the request and the server has no default")
        lease = self.pool.acquire_loaded(name, keep)
        if lease is None:
            try:
                lease = await asyncio.to_thread(self.pool.acquire, name, keep)
            except ModelNotFound as e:
                e.param = e.param or "model"    # the request's field that named it
                raise
        if not lease.llm.engine.alive:
            lease.release()
            raise EngineFailed(f"the engine of {lease.name!r} has stopped: "
                               f"{lease.llm.engine.failure or 'shut down'}")
        return lease

    def health(self) -> tuple[str, str | None]:
        """("ok" | "loading" | "error", why)."""
        if self.load_error:
            return "error", self.load_error
        if self.preloading:
            return "loading", None
        for entry in self.pool.loaded():
            if entry.llm is not None and not entry.llm.engine.alive:
                return "error", f"the engine of {entry.name!r} has stopped: {entry.llm.engine.failure}"
        return "ok", None


async def leased(lease: Lease, respond: Awaitable[Response]) -> Response:
    """Await `respond` on `lease`: released when it fails or returns a whole
    response; a streaming response releases it when its stream ends."""
    try:
        response = await respond
    except BaseException:
        lease.release()
        raise
    if not isinstance(response, StreamingResponse):
        lease.release()
    return response


def request_keep_alive(raw) -> float | None:
    """Seconds (FOREVER: -1) from a request's `keep_alive`; None when absent.
    Raises InvalidParams naming the field."""
    if raw is None:
        return None
    try:
        return parse_keep_alive(raw)
    except ValueError as e:
        raise InvalidParams(f"'keep_alive' {e}", param="keep_alive") from None


def state_of(request: Request) -> ServerState:
    return request.app.state.llmctl

