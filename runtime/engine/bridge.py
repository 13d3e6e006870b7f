"""Hand engine events to the event loop, one wake-up per batch of events.

The engine thread emits one event per token per stream. Waking the loop for
each (call_soon_threadsafe writes to a self-pipe every time) costs a context
switch per token, and on a small CPU every switch steals time from
llama.cpp's compute threads. So events are buffered and the loop is woken
once to deliver everything that arrived since it last ran."""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from llmctl.runtime.engine.events import Event


class EventBridge:
    """Buffers engine events for one event loop; see the module docstring."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Event], Event]] = []
        self._scheduled = False

    def sink(self, queue: asyncio.Queue[Event]) -> Callable[[Event], None]:
        """A callable the engine may call from its thread, which puts each
        event into `queue` on the loop. It never raises."""
        def emit(event: Event) -> None:
            with self._lock:
                self._pending.append((queue, event))
                if self._scheduled:
                    return
                self._scheduled = True
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:
                # The loop has closed (shutdown): nobody is left to read the
                # event, and the engine thread must not die of it.
                with self._lock:
                    self._pending.clear()
        return emit

    def _deliver(self) -> None:
        with self._lock:
            pending, self._pending = self._pending, []
            self._scheduled = False
        for queue, event in pending:
            queue.put_nowait(event)
