"""A Sequence is one request's life inside the engine: its tokens, its place
in the KV cache, how far its prompt has been computed, and which of the
lifecycle states below it is in. Only the scheduler and its slot table
change `status`."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Callable

from llmctl.runtime.sampling import SamplingParams

if TYPE_CHECKING:
    from llmctl.runtime.engine.events import Event
    from llmctl.runtime.engine.repetition import LoopDetector
    from llmctl.runtime.prefix_cache.reuse import Reuse

_ids = itertools.count(1)


class Status(Enum):
    """Where a request is. A finished sequence's slot may stay *parked* with
    its KV for later requests; that is the slot's state (the slot table's),
    not the sequence's."""

    WAITING = "waiting"                 # queued, no slot yet
    WAITING_PREFIX = "waiting_prefix"   # has a slot; waits for a leader's shared prefix
    PREFILLING = "prefilling"           # its prompt is being computed in chunks
    DECODING = "decoding"               # one token per step
    FINISHED = "finished"

    @property
    def has_slot(self) -> bool:
        return self in (Status.WAITING_PREFIX, Status.PREFILLING, Status.DECODING)


@dataclass
class Sequence:
    """One request inside the engine: its prompt, sampling and output, its slot
    and how much of its KV is computed or reused, its status and its timestamps."""

    prompt: list[int]
    params: SamplingParams
    max_new: int                        # resolved max_tokens (context-capped)
    emit: Callable[[Event], None] = lambda event: None
    id: int = field(default_factory=lambda: next(_ids))
    status: Status = Status.WAITING
    slot: int = -1                      # llama.cpp seq_id while it has a slot
    n_computed: int = 0                 # tokens of `tokens` already in the KV
    n_cached: int = 0                   # prompt tokens reused from the prefix cache
    cached_from_disk: bool = False      # ...restored from a disk file (else memory)
    kv_src: tuple[int, int] = (-1, 0)   # (slot, n): reuse n prompt tokens whose KV is in slot
    moved: Reuse | None = None          # ...and these runs past them, moved (prefix_cache.reuse)
    wait_for: "Sequence | None" = None  # the prefilling leader it waits for (WAITING_PREFIX)
    wait_until: int = 0                 # ...until the leader has computed this many tokens
    output: list[int] = field(default_factory=list)
    spec_cap: int = 64                  # most guesses its next step may check (speculation)
    backend_sampled: bool = False       # llama.cpp samples it in the graph: one row a step
    cancelled: bool = False
    loop: "LoopDetector | None" = None  # with params.loop_guard, from its first token
    finish_reason: str | None = None
    stop_string: str | None = None      # the stop string that ended it, if one did
    arrived: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    @property
    def prefilled(self) -> bool:
        return self.n_computed >= len(self.prompt)
