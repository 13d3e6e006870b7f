"""A Sequence is one request's life inside the engine: its tokens, its place
in the KV cache, and how far its prompt has been computed."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable

from llmctl.runtime.sampling import SamplingParams

_ids = itertools.count(1)


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    prompt: list[int]
    params: SamplingParams
    max_new: int                        # resolved max_tokens (context-capped)
    emit: Callable[[Any], None] = lambda event: None
    id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    slot: int = -1                      # llama.cpp seq_id while RUNNING
    n_computed: int = 0                 # tokens of `tokens` already in the KV
    n_cached: int = 0                   # prompt tokens reused from the prefix cache
    kv_src: tuple[int, int] = (-1, 0)   # (slot, n): reuse n prompt tokens whose KV is in slot
    wait_for: "Sequence | None" = None  # a prefilling leader whose prefix this one will copy
    wait_until: int = 0                 # ...once the leader has computed this many tokens
    output: list[int] = field(default_factory=list)
    cancelled: bool = False
    finish_reason: str | None = None
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def n_prompt_left(self) -> int:
        return max(len(self.prompt) - self.n_computed, 0)

    @property
    def prefilled(self) -> bool:
        return self.n_computed >= len(self.prompt)

    def next_chunk(self, budget: int) -> list[int]:
        """The next tokens to feed: a prompt chunk, or the last sampled token."""
        if not self.prefilled:
            return self.prompt[self.n_computed:self.n_computed + budget]
        return [self.output[-1]]
