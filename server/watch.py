"""Watching a request's connection: the moment its client hangs up, the
work done for it stops (generation streams are closed, embeddings stop at
their next batch), streaming or not, so an abandoned request never holds a
slot until it would have ended."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Protocol, Sequence

from fastapi import Request

from llmctl.runtime.embed import CancelFlag
from llmctl.server.state import state_of
from llmctl.server.workers import run_on


class Closable(Protocol):
    """What stops when the client leaves: an EventFeed, a CancelFlag."""

    def close(self) -> None: ...


async def cancel_on_disconnect(request: Request, work: Sequence[Closable]) -> None:
    """Close each of `work` once `request`'s client disconnects; run it as
    a task and cancel the task when the response is done."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            for item in work:
                item.close()
            return


async def embed_watched(request: Request, embed: Callable[..., Any], *args: Any,
                        **kwargs: Any) -> Any:
    """`embed(*args, **kwargs, cancel=flag)` on a worker thread, the flag set
    the moment the client disconnects, so the work stops at its next batch.
    Raises what `embed` raises: Cancelled (a 499 nobody reads) once the
    client is gone."""
    flag = CancelFlag()
    watcher = asyncio.create_task(cancel_on_disconnect(request, [flag]))
    # Embeddings' own executor, so a long request never holds a thread that
    # renders or parses other requests.
    try:
        return await run_on(state_of(request).workers.embed, embed, *args, **kwargs, cancel=flag)
    finally:
        watcher.cancel()
