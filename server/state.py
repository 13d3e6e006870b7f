"""What the server knows between requests: the model (once loaded), its
names and the HTTP policy. Statistics live in the engine (llm.stats())."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fastapi import Request

from llmctl.errors import EngineFailed, ModelLoading
from llmctl.runtime.llm import LLM
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
    name: str
    aliases: set[str] = field(default_factory=set)
    policy: HttpPolicy = field(default_factory=HttpPolicy)
    defaults: SamplingParams = field(default_factory=SamplingParams)
    llm: LLM | None = None
    load_error: str | None = None
    started: float = field(default_factory=time.time)

    def ready(self) -> LLM:
        """The loaded model. Raises ModelLoading while it loads (or failed
        to) and EngineFailed once its engine thread has died."""
        if self.llm is None:
            raise ModelLoading(self.load_error or "the model is still loading")
        if not self.llm.engine.alive:
            raise EngineFailed(f"the engine has stopped: {self.llm.engine.failure or 'shut down'}")
        return self.llm


def state_of(request: Request) -> ServerState:
    return request.app.state.llmctl
