"""The server's own worker threads, by kind, so one kind of blocking work
can never starve another: parsing large request bodies and converting
requests (validation and grammars), each under a deadline, rendering and
tokenizing prompts, resolving model names (which may join a model's part
files), loading models, and small pool and store queries (/api/tags,
/api/ps, room for a model).

A deadline counts from the moment a worker starts the call: time queued
behind other requests is the server's load, never the request's fault,
and never refuses it. What may queue is bounded once, for the whole
server, by admission.py (a 503 with Retry-After past it).

asyncio's default executor is not used: its threads are shared by every
to_thread call and joined at exit, so a stuck call there would hold up
both other requests and the server's shutdown. These threads are daemons
that nothing joins: a worker stuck in a pathological conversion neither
blocks the event loop nor keeps SIGTERM from ending the process."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from llmctl.errors import InvalidParams, ModelsBusy
from llmctl.settings import Settings


class ServerBusy(ModelsBusy):
    """The server's queue is at its configured bound (or a bounded
    executor's is full); the request may be retried. A ModelsBusy, so that
    it is a 503 with Retry-After."""

    code = "server_busy"


class DaemonExecutor(cf.Executor):
    """A bounded pool of daemon threads named `name`-N, started on demand,
    with at most `max_queued` calls waiting for one (None: no bound).
    `shutdown` never waits for a running call: a thread stuck forever ends
    with the process."""

    def __init__(self, name: str, max_workers: int, max_queued: int | None = None):
        self.name, self.max_workers, self.max_queued = name, max_workers, max_queued
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    @property
    def queued(self) -> int:
        """Calls waiting for a worker (cancelled ones not yet dropped included)."""
        return self._work.qsize()

    @property
    def busy(self) -> int:
        """Workers running a call now."""
        with self._lock:
            return len(self._threads) - self._idle

    def submit(self, fn: Callable, /, *args, **kwargs) -> cf.Future:
        """Run fn(*args, **kwargs) on a worker; past max_workers busy ones
        it waits in a queue. Raises ServerBusy when `max_queued` calls wait
        already (each may hold a request body)."""
        future: cf.Future = cf.Future()
        with self._lock:
            if self.max_queued is not None and self._work.qsize() >= self.max_queued:
                raise ServerBusy(f"the server is busy: {self.max_queued} requests already wait "
                                 f"for its {self.name} workers")
            self._work.put((future, fn, args, kwargs))
            # A new thread only when the calls waiting outnumber idle threads.
            if self._idle < self._work.qsize() and len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._run, args=(self._work,), daemon=True,
                                          name=f"{self.name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _run(self, work: queue.SimpleQueue) -> None:
        while True:
            # Idle: blocked in get. Counted only for the current queue; a
            # shutdown starts the count afresh.
            with self._lock:
                if work is self._work:
                    self._idle += 1
            item = work.get()
            with self._lock:
                if work is self._work:
                    self._idle -= 1
            if item is None:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:    # handed to the awaiting request
                    future.set_exception(e)
            del item, future, fn, args, kwargs

    def shutdown(self, wait: bool = False, *, cancel_futures: bool = True) -> None:
        """Cancel what has not started and let idle threads end; running
        calls are never waited for (`wait` is ignored). Work submitted
        later starts new threads."""
        with self._lock:
            work, threads = self._work, self._threads
            self._work, self._threads, self._idle = queue.SimpleQueue(), [], 0
            while cancel_futures:
                try:
                    work.get_nowait()[0].cancel()
                except queue.Empty:
                    break
            for _ in threads:
                work.put(None)


# Calls that may wait per worker in an executor with no admission in front
# of it (the cluster ingress): past it a request is refused at once
# rather than queued holding its body. `llmctl serve` bounds its queue in
# admission.py instead, by count and by memory.
QUEUE_PER_WORKER = 4


_KINDS = ("body", "parse", "render", "resolve", "load", "query", "embed")


@dataclass
class Workers:
    """One app's executors, sized by the settings (`of`).
    Their queues have no bound of their own: what may wait in all of them
    together is the server's admission's (admission.py)."""

    # Bodies over body.INLINE_BYTES: JSON parsing and validation, apart
    # from conversion, so a flood of large bodies cannot make small chats
    # wait on it, nor expensive conversions make large plain bodies wait.
    body: DaemonExecutor
    # The expensive lane: schemas, grammars and tools become grammars here,
    # each under the parse deadline and the grammar budget. Small plain
    # requests never wait on it (generation.parse_generation).
    parse: DaemonExecutor
    render: DaemonExecutor
    # Name resolution may join a model's part files (minutes): never on the
    # load threads, so a 404 or a load does not wait behind a join.
    resolve: DaemonExecutor
    load: DaemonExecutor
    query: DaemonExecutor
    # Embedding requests take turns per batch on one lock, so more threads
    # than this only queue there.
    embed: DaemonExecutor
    parse_deadline_s: float
    body_deadline_s: float

    @classmethod
    def of(cls, settings: Settings | None = None) -> "Workers":
        """Executors of the settings' sizes (None: the defaults), with
        their deadlines; no thread starts before a call."""
        settings = settings or Settings()
        return cls(**{kind: DaemonExecutor(f"llmctl-{kind}", getattr(settings, f"workers_{kind}"))
                      for kind in _KINDS},
                   parse_deadline_s=settings.parse_deadline_s,
                   body_deadline_s=settings.body_deadline_s)

    def executors(self) -> dict[str, DaemonExecutor]:
        """Every executor by kind."""
        return {kind: getattr(self, kind) for kind in _KINDS}

    def snapshot(self) -> dict[str, dict[str, int]]:
        """{kind: {"busy": workers running a call, "queued": calls waiting}}."""
        return {kind: {"busy": e.busy, "queued": e.queued} for kind, e in self.executors().items()}

    def shutdown(self) -> None:
        for executor in self.executors().values():
            executor.shutdown()


async def run_on(executor: cf.Executor, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) on `executor`, awaited without blocking the loop.
    Raises what submit raises (ServerBusy past a bound queue) and what fn
    raises."""
    future = executor.submit(fn, *args, **kwargs)
    return await asyncio.wrap_future(future)


async def run_with_deadline(executor: cf.Executor, deadline_s: float, fn: Callable,
                            *args: Any) -> Any:
    """fn(*args) on `executor`, abandoned `deadline_s` after a worker
    started it (the call runs on and its result is dropped). Time spent
    queued behind other requests never counts: that wait is the server's
    load, not this request's cost. Raises TimeoutError past the deadline,
    ServerBusy when a bounded executor's queue is full, and what fn
    raises; cancelling the awaiting task drops a call not yet started."""
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    began: list[float] = []

    def wake(_: object = None) -> None:
        try:
            loop.call_soon_threadsafe(started.set)
        except RuntimeError:
            pass                # the loop closed: no one awaits this call

    def call() -> Any:
        began.append(time.monotonic())
        wake()
        return fn(*args)

    future = executor.submit(call)
    future.add_done_callback(wake)      # a call cancelled by shutdown never starts
    try:
        await started.wait()
    except asyncio.CancelledError:
        future.cancel()         # fails once a worker has taken the call: then it runs
        raise
    if future.done():
        return future.result()
    left = (began[0] if began else time.monotonic()) + deadline_s - time.monotonic()
    try:
        async with asyncio.timeout(max(left, 0)):
            return await asyncio.wrap_future(future)
    except TimeoutError:
        raise TimeoutError from None


def converting_field(body: dict, fields: tuple[str, ...]) -> str | None:
    """The first of `fields` (those that become grammars) `body` sets."""
    return next((f for f in fields if body.get(f) not in (None, [], {})), None)


async def parse_within_deadline(workers: Workers, field: str | None, fn: Callable,
                                *args: Any, lane: DaemonExecutor | None = None) -> Any:
    """fn(*args), a request parser or grammar builder, on the parse workers
    (or `lane`) under their deadline, which counts from when a worker
    starts it. Raises InvalidParams when it runs past it, naming `field`
    (the request's field being converted, when known), and what fn raises."""
    try:
        return await run_with_deadline(lane or workers.parse, workers.parse_deadline_s, fn, *args)
    except TimeoutError:
        what = f"'{field}'" if field else "the request"
        raise InvalidParams(f"{what} took longer than {workers.parse_deadline_s:g} s to "
                            "convert", param=field) from None
