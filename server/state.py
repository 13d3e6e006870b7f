"""What the server knows between requests: the model (once loaded), its
names, the API key and the metrics."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from fastapi import Request

from llmctl.errors import ModelLoading
from llmctl.runtime.llm import LLM
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.bridge import EventBridge
from llmctl.server.metrics import Metrics


@dataclass(frozen=True)
class HttpPolicy:
    """Who may call the server and how much they may send."""

    api_key: str | None = None          # required on every route but /health
    metrics_public: bool = False        # /metrics without the key, for Prometheus
    allowed_origins: tuple[str, ...] = ()   # browser origins beyond localhost
    max_body_bytes: int = 8 << 20


@dataclass
class ServerState:
    name: str
    aliases: set[str] = field(default_factory=set)
    policy: HttpPolicy = field(default_factory=HttpPolicy)
    defaults: SamplingParams = field(default_factory=SamplingParams)
    llm: LLM | None = None
    load_error: str | None = None
    metrics: Metrics = field(default_factory=Metrics)
    started: float = field(default_factory=time.time)
    _bridges: dict[int, EventBridge] = field(default_factory=dict)

    def ready(self) -> LLM:
        if self.llm is None:
            raise ModelLoading(self.load_error or "the model is still loading")
        return self.llm

    def bridge(self) -> EventBridge:
        """The engine-to-loop hand-off of the running event loop."""
        loop = asyncio.get_running_loop()
        bridge = self._bridges.get(id(loop))
        if bridge is None:
            bridge = self._bridges[id(loop)] = EventBridge(loop)
        return bridge


def state_of(request: Request) -> ServerState:
    return request.app.state.llmctl
