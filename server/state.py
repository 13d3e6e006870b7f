"""What the server knows between requests: the model pool, the default
model, the HTTP policy and the output options. Statistics live in the
engines (pool.stats())."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, TypeVar

from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from llmctl.errors import EngineFailed, ModelLoading, ModelNotFound, ModelsBusy
from llmctl.runtime.pool.model_pool import Lease, Loaded, ModelPool, Reservation
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.admission import Admission
from llmctl.server.keep_alive import request_keep_alive
from llmctl.server.model_names import resolve_request, untagged
from llmctl.server.workers import Workers, run_on
from llmctl.settings import Settings

if TYPE_CHECKING:
    import concurrent.futures as cf

    from llmctl.presets import Preset
    from llmctl.runtime.llm import LLM
    from llmctl.store.resolve import ResolvedModel
    from llmctl.tools.mcp_hub import McpHub

T = TypeVar("T")


@dataclass(frozen=True)
class HttpPolicy:
    """Who may call the server and how much they may send."""

    api_key: str | None = None          # required on every route but /health
    metrics_public: bool = False        # /metrics without the key, for Prometheus
    allowed_origins: tuple[str, ...] = ()   # browser origins beyond localhost
    max_body_bytes: int = 8 << 20
    webui: bool = True                  # the chat page at / (--no-webui: off, a 404)


@dataclass
class ServerState:
    """What the server keeps between requests: the pool, the default model,
    the HTTP policy, sampling defaults, the reasoning format and the preload's state."""

    pool: ModelPool
    default: str | None = None          # the model (or preset) of a request that names none
    presets: dict[str, Preset] = field(default_factory=dict)   # the config file's, by name
    policy: HttpPolicy = field(default_factory=HttpPolicy)
    defaults: SamplingParams = field(default_factory=SamplingParams)
    reasoning_format: str = "auto"      # --reasoning-format; a request may name its own
    preloading: bool = False            # `serve MODEL` is loading MODEL
    load_error: str | None = None       # ... and it failed
    started: float = field(default_factory=time.time)
    settings: Settings = field(default_factory=Settings)      # Settings.load()'s, at start-up
    workers: Workers = field(default_factory=Workers.of)     # the app shuts them down
    admission: Admission = field(default_factory=Admission)     # what may queue
    mcp: McpHub | None = None           # `serve --mcp`: the MCP servers requests may name
    # name -> its one resolve
    _resolving: dict[str, asyncio.Future[ResolvedModel]] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self.admission.slots = self.slots

    def slots(self) -> int:
        """The loaded engines' slots (at least one model's worth, so a
        server still loading its model counts the slots it will have)."""
        loaded = [e.llm.opts.max_num_seqs for e in self.pool.loaded() if e.llm is not None]
        return sum(loaded) or self.pool.opts.max_num_seqs

    @classmethod
    def serving(cls, llm: LLM, **kwargs: Any) -> "ServerState":
        """A state whose pool holds `llm` (loaded by the caller) as the
        default model, for an app built around one LLM object."""
        pool = ModelPool(llm.opts, memory_budget=1 << 62)
        pool.adopt(llm.resolved, llm)
        settings = llm.opts.settings
        return cls(pool, default=llm.name, settings=settings, workers=Workers.of(settings),
                   **kwargs)

    def preset(self, model: str | None) -> Preset | None:
        """The preset a request's `model` names (None: the default), with
        Ollama's tag dropped; None when it names a model. Raises nothing."""
        name = model or self.default
        return self.presets.get(untagged(name)) if name else None

    def model_of(self, model: str | None) -> str | None:
        """The model a request's `model` means: a preset's own model, else
        `model` itself (None: the default). Raises nothing."""
        preset = self.preset(model)
        return preset.model if preset else (model or self.default)

    async def lease(self, model: str | None, keep_alive: object = None) -> Lease:
        """A lease on the model a request names (the default when None; a
        preset's own model for a preset, so presets over one model share
        it), loaded if needed; waiting for it holds no thread. `keep_alive` is
        the request's raw value. Raises InvalidParams for a bad keep_alive,
        ModelLoading when no model is named and none is the default,
        EngineFailed for a dead or wedged engine, ModelNotFound (param "model"),
        ModelsBusy after the pool's wait, and what loading raises."""
        keep = request_keep_alive(keep_alive)
        name = self.model_of(model)
        if name is None:
            raise ModelLoading("no model is named in the request and the server has no default")
        lease = self.pool.acquire_loaded(untagged(name), keep)
        if lease is None:
            try:
                lease = await self._acquire(name, keep)
            except ModelNotFound as e:
                e.param = e.param or "model"    # the request's field that named it
                raise
        llm = lease.llm
        if not llm.alive:
            lease.release()
            raise EngineFailed(f"the engine of {lease.name!r} has stopped: "
                               f"{llm.failure or 'shut down'}")
        # A wedged step never ends: a request queued behind it would wait forever.
        why = llm.stalled()
        if why:
            lease.release()
            raise EngineFailed(f"the engine of {lease.name!r} is stalled: {why}")
        return lease

    async def _acquire(self, name: str, keep: float | None) -> Lease:
        """ModelPool.acquire without holding a thread while it waits: tries
        run on the query workers, the wait is an asyncio event the pool sets
        when room may have appeared, and the load runs on the load workers."""
        pool, workers = self.pool, self.workers
        resolved = await self._resolve(name)
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()

        def wake() -> None:             # on a pool thread, under its lock
            loop.call_soon_threadsafe(woken.set)

        pool.add_waiter(wake, resolved.name)    # woken only by room for this model
        try:
            deadline = loop.time() + pool.wait_s
            while True:
                woken.clear()           # before trying: a wake-up after it is kept
                got = await _settled(workers.query.submit(pool.try_reserve, resolved, keep),
                                     lambda r: _undo(pool, r))
                if got.entry is not None:
                    break
                try:
                    async with asyncio.timeout(max(deadline - loop.time(), 0)):
                        await woken.wait()
                except TimeoutError:
                    raise ModelsBusy(got.why) from None
                got.raise_failed()
        finally:
            pool.remove_waiter(wake)
        if not got.fresh:
            return Lease(pool, got.entry)
        return await _settled(workers.load.submit(pool.fill, got.entry), Lease.release)

    async def _resolve(self, name: str) -> ResolvedModel:
        """The model a request's `name` means (model_names.resolve_request)
        on the resolve workers, once for all the
        requests that ask at the same time: resolving may join a model's
        part files (minutes), so it never runs on the load workers, and
        forty requests for it must not take forty threads to wait."""
        task = self._resolving.get(name)
        if task is None:
            task = asyncio.ensure_future(run_on(self.workers.resolve, resolve_request,
                                                self.pool, name))
            self._resolving[name] = task
            task.add_done_callback(lambda _: self._resolving.pop(name, None))
        return await asyncio.shield(task)

    def health(self) -> tuple[str, str | None]:
        """("ok" | "loading" | "error", why): an engine that stopped, or one
        that has work and has made no step for a while, is an error."""
        if self.load_error:
            return "error", self.load_error
        if self.preloading:
            return "loading", None
        for entry in self.pool.loaded():
            why = _engine_trouble(entry)
            if why is not None:
                return "error", why
        return "ok", None


def _engine_trouble(entry: Loaded) -> str | None:
    llm = entry.llm
    if llm is None:
        return None
    if not llm.alive:
        return f"the engine of {entry.name!r} has stopped: {llm.failure}"
    why = llm.stalled()         # has work and made no step for LLMCTL_ENGINE_STALL_S
    return f"model {entry.name!r}: {why}" if why else None


def _undo(pool: ModelPool, got: Reservation) -> None:
    """Give back what a try_reserve got for a request that went away."""
    if got.entry is None:
        return
    if got.fresh:
        pool.abandon(got.entry)
    else:
        Lease(pool, got.entry).release()


async def _settled(future: cf.Future[T], undo: Callable[[T], None]) -> T:
    """The result of a worker's `future`. Should the awaiting request be
    cancelled first, the call still runs to its end and `undo(result)`
    gives back what it took (a use of a model, a reservation)."""
    try:
        return await asyncio.shield(asyncio.wrap_future(future))
    except asyncio.CancelledError:
        def later(f: cf.Future[T]) -> None:
            if not f.cancelled() and f.exception() is None:
                undo(f.result())
        future.add_done_callback(later)
        raise


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


def state_of(request: Request) -> ServerState:
    """The ServerState of the app serving `request`."""
    return request.app.state.llmctl

