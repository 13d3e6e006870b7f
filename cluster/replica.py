"""One llmctl engine as a Ray Serve replica: it loads the model once and
runs llmctl's own FastAPI app (server/app.py) in-process, so request parsing,
validation, rendering and errors have one owner. The ingress forwards the
raw HTTP request; `handle` yields the response head, then its body chunks as
the app sends them (a stream stays a stream across Ray)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from dataclasses import dataclass, field
from typing import AsyncIterator

from llmctl.runtime.load_options import LoadOptions
from llmctl.server.state import HttpPolicy
from llmctl.store.resolve import ResolvedModel

log = logging.getLogger("llmctl.cluster")

REPORT_EVERY_S = 1.0


@dataclass(frozen=True)
class ReplicaSpec:
    """What every replica loads and how it serves: built once by the driver
    (the model resolved there, so replicas never search a store)."""

    resolved: ResolvedModel
    load: LoadOptions
    cache_dir: str | None = None        # None: the default (LLMCTL_HOME/cache)
    # GPUs each replica reserves in Ray (num_gpus): Ray gives a replica its
    # own devices (CUDA_VISIBLE_DEVICES), and --n-gpu-layers auto fills them.
    gpus: float = 0.0
    host: str = "127.0.0.1"             # the ingress's, for the app's Host checks
    port: int = 8000
    # The proxies, the ingress and every replica apply it: a replica reached
    # around the ingress (any actor of the Ray cluster may call it) is no
    # more open than the ingress.
    policy: HttpPolicy = field(default_factory=HttpPolicy)


class Replica:
    """A Ray Serve deployment class (wrapped by deploy.py). Raises what
    LLM loading raises, which Ray reports as a failed replica start."""

    # Ray Serve awaits an async __init__; Python's type rules have no such thing.
    async def __init__(self, spec: ReplicaSpec, board) -> None:  # type: ignore[misc]
        from ray import serve

        from llmctl.runtime.llm import LLM
        from llmctl.server.app import create_app
        from llmctl.server.state import ServerState

        self.id = serve.get_replica_context().replica_id.unique_id
        self.spec = spec
        if spec.cache_dir:
            # This process is the replica's own: the setting reaches only it.
            os.environ["LLMCTL_CACHE_DIR"] = spec.cache_dir
        # Off the event loop: Ray's health checks keep being answered meanwhile.
        self.llm = await asyncio.to_thread(LLM, spec.resolved, spec.load)
        self.app = create_app(ServerState.serving(self.llm, policy=spec.policy),
                              bind_host=spec.host)
        self.board = board
        self._reporter = asyncio.create_task(self._report_forever())

    async def _report_forever(self) -> None:
        while True:
            try:
                await self.board.report.remote(self.id, self.llm.stats(), self._health(),
                                               os.getpid())
            except Exception as e:  # the board restarting: report again next tick
                log.debug("replica %s: report failed: %s", self.id, e)
            await asyncio.sleep(REPORT_EVERY_S)

    def _health(self) -> str:
        return "ok" if self.llm.alive else f"error: {self.llm.failure}"

    def check_health(self) -> None:
        """Ray Serve's periodic probe: a dead engine makes Ray replace this
        replica. Raises RuntimeError then."""
        if not self.llm.alive:
            raise RuntimeError(f"engine stopped: {self.llm.failure}")

    async def handle(self, method: str, path: str, query: bytes, headers: list,
                     body: bytes, affinity: str | None = None,
                     pin: str | None = None) -> AsyncIterator:
        """Run one HTTP request through llmctl's app. Yields a head dict
        (status, headers, replica) and then the body's bytes. `affinity` and
        `pin` are read by the router only."""
        async for item in asgi_call(self.app, self._scope(method, path, query, headers), body):
            if isinstance(item, dict):
                item["replica"] = self.id
            yield item

    def _scope(self, method: str, path: str, query: bytes, headers: list) -> dict:
        return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
                "method": method, "scheme": "http", "path": path, "raw_path": path.encode(),
                "root_path": "", "query_string": query,
                "headers": [(k.encode(), v.encode()) for k, v in headers],
                "client": ("127.0.0.1", 0), "server": (self.spec.host, self.spec.port)}

    def __del__(self) -> None:
        # Ray Serve calls __del__ on a graceful replica stop: free the model.
        with contextlib.suppress(Exception):
            self._reporter.cancel()
            self.llm.close()


async def asgi_call(app, scope: dict, body: bytes) -> AsyncIterator:
    """Call an ASGI app with one whole request body; yield the response head
    ({"status", "headers"}) and then each non-empty body chunk as it is sent.
    Closing the generator early tells the app the client went away (which
    cancels a generation) and waits for the app to finish."""
    sent: asyncio.Queue = asyncio.Queue()
    gone = asyncio.Event()
    delivered = False

    async def receive() -> dict:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await gone.wait()
        return {"type": "http.disconnect"}

    async def run() -> None:
        try:
            await app(scope, receive, sent.put)
        finally:
            await sent.put(None)

    task = asyncio.create_task(run())
    try:
        while (message := await sent.get()) is not None:
            if message["type"] == "http.response.start":
                yield {"status": message["status"],
                       "headers": [(k.decode(), v.decode()) for k, v in message["headers"]]}
            elif message["type"] == "http.response.body":
                if message.get("body"):
                    yield message["body"]
                if not message.get("more_body"):
                    break
    finally:
        gone.set()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
