"""The server's own worker threads, by kind, so one kind of blocking work
can never starve another: parsing requests (JSON and grammar conversion,
under a deadline), rendering and tokenizing prompts, loading models, and
small pool and store queries (/api/tags, /api/ps, room for a model).

asyncio's default executor is not used: its threads are shared by every
to_thread call and joined at exit, so a stuck call there would hold up
both other requests and the server's shutdown. These threads are daemons
that nothing joins: a worker stuck in a pathological conversion neither
blocks the event loop nor keeps SIGTERM from ending the process."""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import os
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from llmctl import config
from llmctl.errors import InvalidParams


class DaemonExecutor(cf.Executor):
    """A bounded pool of daemon threads named `name`-N, started on demand.
    `shutdown` never waits for a running call: a thread stuck forever ends
    with the process."""

    def __init__(self, name: str, max_workers: int):
        self.name, self.max_workers = name, max_workers
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle = 0

    def submit(self, fn: Callable, /, *args, **kwargs) -> cf.Future:
        """Run fn(*args, **kwargs) on a worker; past max_workers busy ones
        it waits in a queue."""
        future: cf.Future = cf.Future()
        with self._lock:
            self._work.put((future, fn, args, kwargs))
            if self._idle:
                self._idle -= 1         # that idle thread takes it
            elif len(self._threads) < self.max_workers:
                thread = threading.Thread(target=self._run, args=(self._work,), daemon=True,
                                          name=f"{self.name}-{len(self._threads)}")
                self._threads.append(thread)
                thread.start()
        return future

    def _run(self, work: queue.SimpleQueue) -> None:
        while (item := work.get()) is not None:
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as e:    # handed to the awaiting request
                    future.set_exception(e)
            del item, future, fn, args, kwargs
            with self._lock:
                if work is self._work:
                    self._idle += 1

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


def _env_int(name: str, default: int) -> int:
    return max(1, int(config.env(name, str(default))))


PARSE_DEADLINE_S = float(config.env("PARSE_DEADLINE_S", "10"))


@dataclass
class Workers:
    """One app's executors. Sizes (LLMCTL_WORKERS_PARSE, _RENDER, _LOAD,
    _QUERY, _EMBED) default to what one machine's cores can keep busy; requests
    beyond them queue on the asyncio side, holding no thread."""

    parse: DaemonExecutor = field(default_factory=lambda: DaemonExecutor(
        "llmctl-parse", _env_int("WORKERS_PARSE", 4)))
    render: DaemonExecutor = field(default_factory=lambda: DaemonExecutor(
        "llmctl-render", _env_int("WORKERS_RENDER", max(4, os.cpu_count() or 1))))
    load: DaemonExecutor = field(default_factory=lambda: DaemonExecutor(
        "llmctl-load", _env_int("WORKERS_LOAD", 2)))
    query: DaemonExecutor = field(default_factory=lambda: DaemonExecutor(
        "llmctl-query", _env_int("WORKERS_QUERY", 4)))
    # Embedding requests take turns per batch on one lock, so more threads
    # than this only queue there.
    embed: DaemonExecutor = field(default_factory=lambda: DaemonExecutor(
        "llmctl-embed", _env_int("WORKERS_EMBED", 2)))
    parse_deadline_s: float = PARSE_DEADLINE_S

    def shutdown(self) -> None:
        for executor in (self.parse, self.render, self.load, self.query, self.embed):
            executor.shutdown()


async def run_on(executor: cf.Executor, fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """fn(*args, **kwargs) on `executor`, awaited without blocking the loop."""
    future = executor.submit(fn, *args, **kwargs)
    return await asyncio.wrap_future(future)


async def run_with_deadline(executor: cf.Executor, deadline_s: float, fn: Callable,
                            *args: Any) -> Any:
    """fn(*args) on `executor`, abandoned after `deadline_s` (the time spent
    queued for a worker counts). Raises TimeoutError past the deadline (the
    call, if it started, runs on and its result is dropped) and what fn
    raises."""
    future = executor.submit(fn, *args)
    try:
        return await asyncio.wait_for(asyncio.wrap_future(future), deadline_s)
    except (TimeoutError, asyncio.TimeoutError):
        future.cancel()
        raise TimeoutError from None


def converting_field(body: dict, fields: tuple[str, ...]) -> str | None:
    """The first of `fields` (those that become grammars) `body` sets."""
    return next((f for f in fields if body.get(f) not in (None, [], {})), None)


async def parse_within_deadline(workers: Workers, field: str | None, fn: Callable,
                                *args: Any) -> Any:
    """fn(*args), a request parser or grammar builder, on the parse workers
    under their deadline. Raises InvalidParams past it, naming `field` (the
    request's field being converted, when known), and what fn raises."""
    try:
        return await run_with_deadline(workers.parse, workers.parse_deadline_s, fn, *args)
    except TimeoutError:
        what = f"'{field}'" if field else "the request"
        raise InvalidParams(f"{what} took longer than {workers.parse_deadline_s:g} s to "
                            "convert", param=field) from None
