"""Who runs next, and with how many tokens. Plain Python with no llama.cpp
in sight, so every decision is unit-tested without a model.

Each step is a StepPlan (plan.py): the KV to attach first for sequences
just admitted (the prefix cache's plans), then a token per decoding
sequence, then prompt chunks in the rest of the token budget, oldest
request first. Feeding prompts one after another (rather than a slice of
each) makes the first request's first token come soonest, and never stalls
decoding sequences for longer than one budget's worth of prefill. The runner
carries the plan out; `update` (lifecycle.py) applies its result.

The slots themselves (free, parked with KV, prefix plans) are the slot
table's (slots.py). Prompts are cut by prefix_cache.rule's tile rule, so
that a token's KV and logits never depend on whether its prefix came from
the cache: a chunk cut for the budget leaves a tile for later, and such a
chunk is marked to run in a llama_decode call of its own (Work.alone).

With speculation on, the scheduler only budgets guessed rows: it gives each
decoding sequence `room` for guesses, which a proposer then fills in
(speculation/)."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from llmctl.errors import QueueFull
from llmctl.runtime.batching import CPU_STEP_TOKENS, ENGINE_MAX_QUEUE, SERVE_MAX_NUM_SEQS, UBATCH_TOKENS
from llmctl.runtime.engine.lifecycle import Lifecycle
from llmctl.runtime.engine.output import Output
from llmctl.runtime.engine.plan import Attach, StepPlan, Work, expected
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.slots import SlotTable
from llmctl.runtime.engine.stats import Stats, StatsCollector
from llmctl.runtime.prefix_cache.rule import TILE
from llmctl.runtime.speculation.spec_config import SpecConfig

if TYPE_CHECKING:
    from llmctl.runtime.prefix_cache.cache import AttachPlan
    from llmctl.runtime.prefix_cache.reuse import Reuse


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits the scheduler enforces; validated once, in LoadOptions."""

    max_num_seqs: int = SERVE_MAX_NUM_SEQS
    max_num_batched_tokens: int = CPU_STEP_TOKENS
    max_queue: int = ENGINE_MAX_QUEUE
    prefix_sharing: bool = False
    min_share: int = 32         # shorter prefixes are not worth a copy or a wait
    min_run: int = 0            # moved runs past a difference (prefix_cache/reuse.py); 0: off
    # The exactness rule's tile (prefix_cache/rule.py); 1: any cut is exact
    # (flash attention off), and generated tokens are reused too.
    tile: int = TILE
    max_chunk: int = UBATCH_TOKENS  # llama.cpp's n_ubatch: a longer chunk is cut again there
    spec: SpecConfig = SpecConfig()     # speculation: off unless the caller's options ask
    # Guessed tokens one step may check across all sequences, and the most
    # decoding sequences that speculate at all: a checked row costs compute
    # a full batch no longer has spare (docs/speculation.md has the figures).
    spec_rows: int = 8
    spec_seqs: int = 2
    n_ctx_seq: int = 1 << 30    # a sequence's KV room: guesses must fit it


class AttachPlanner(Protocol):
    """What the scheduler asks the prefix cache (prefix_cache/cache.py)."""

    def plan_attach(self, seq_id: int, slot: int, prompt: list[int], kv_src: tuple[int, int],
                    moved: Reuse | None) -> AttachPlan: ...


class Scheduler(Lifecycle):
    """Owns the request lifecycle: the waiting queue, each sequence's
    Status, the slot table, the token budget and the statistics; `cache`
    (the prefix cache, with prefix sharing) plans where new KV comes from,
    `splicing` says whether runs past a difference can be moved.

    `add`, `cancel`, `counts` and `make_stats` may be called from any
    thread; everything else runs on the engine thread."""

    def __init__(self, cfg: SchedulerConfig, cache: AttachPlanner | None = None,
                 splicing: bool = False):
        self.cfg = cfg
        self.cache, self.splicing = cache, splicing
        self._to_attach: list[Sequence] = []        # admitted, their KV not yet planned
        self._outputs: dict[int, Output] = {}       # each running sequence's text so far
        self._lock = threading.Lock()       # guards _waiting against add()
        self._waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.slots = SlotTable(cfg.max_num_seqs, min_share=cfg.min_share, tile=cfg.tile,
                               min_run=cfg.min_run)
        self._stats = StatsCollector()

    # ---- any thread -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a request. Raises QueueFull when more than `max_queue`
        requests would wait beyond the slots (free or parked) that can take
        them at the next step."""
        with self._lock:
            queued = len(self._waiting) - self.slots.room()
            if queued >= self.cfg.max_queue:
                # Requests whose clients left stay queued until the next step
                # drops them; they must not refuse a live one meanwhile.
                # Counted only here, so the common add stays O(1).
                queued -= sum(1 for waiting in self._waiting if waiting.cancelled)
            if queued >= self.cfg.max_queue:
                raise QueueFull("server busy: the request queue is full, retry shortly")
            seq.status = Status.WAITING
            self._waiting.append(seq)

    @staticmethod
    def cancel(seq: Sequence) -> None:
        """Mark a request cancelled; the engine finishes it at its next step."""
        seq.cancelled = True

    def counts(self) -> tuple[int, int, int, int]:
        """(running, waiting, parked slots, free slots)."""
        return (len(self.running), len(self._waiting), *self.slots.counts())

    def make_stats(self) -> Stats:
        return self._stats.snapshot(*self.counts())

    @property
    def collector(self) -> StatsCollector:
        """The one stats source, which the model's embeddings count into too."""
        return self._stats

    def has_work(self) -> bool:
        return bool(self._waiting or self.running)

    # ---- engine thread: admission -----------------------------------------------

    def take_cancelled(self) -> list[Sequence]:
        with self._lock:
            waiting = [s for s in self._waiting if s.cancelled]
        return [s for s in self.running if s.cancelled] + waiting

    def take_all_waiting(self) -> list[Sequence]:
        with self._lock:
            return list(self._waiting)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into slots, oldest first. A free slot or a
        parked one (evicted least recently used) is taken; a parked slot
        whose tokens best match the prompt is preferred."""
        admitted = []
        while self.slots.room():
            with self._lock:
                if not self._waiting:
                    break
                seq = self._waiting.popleft()
            seq.slot, n_in_place = self.slots.take(seq.prompt)
            seq.kv_src = (seq.slot, n_in_place)
            seq.status = Status.PREFILLING
            self.running.append(seq)
            self._outputs[seq.id] = Output(seq.params)
            if self.cfg.prefix_sharing:
                self.slots.plan_prefix(seq, self.running)
            admitted.append(seq)
        # Those not waiting for a leader get their KV at the next plan.
        self._to_attach += [s for s in admitted if s.status is Status.PREFILLING]
        return admitted

    @staticmethod
    def opened(seq: Sequence, on_backend: bool) -> None:
        """The runner made the sequence's sampler chain, in llama.cpp's
        graph (`on_backend`) or on the host."""
        seq.backend_sampled = on_backend

    def release_waiters(self) -> list[Sequence]:
        """Sequences whose leader has computed what they wait for (or is
        gone), planned again: SlotTable.release_waiters."""
        return self.slots.release_waiters(self.running)

    # ---- engine thread: steps ---------------------------------------------------

    def schedule(self) -> StepPlan:
        """Plan one step: the KV to attach for sequences admitted (or
        released by their leader) since the last plan, a token per decoding
        sequence, then prompt chunks, oldest first, up to the token budget.
        A new sequence's chunk starts where its KV plan's first choice
        leaves it (the runner holds the chunk back if the plan falls back).

        With a tile rule, a chunk of a long prompt is marked `alone`: the
        engine gives it a llama_decode call of its own. With one KV stream
        per sequence, llama.cpp's equal split would put it in a ubatch with
        the neighbouring slots' decode rows, each with as many rows as the
        shortest has, and so compute its first row by another kernel. A call
        of its own keeps the neighbours decoding in the same step."""
        attach = self._plan_attaches()
        start = {a.seq.id: a.expect for a in attach}
        decoding = [seq for seq in self.running if seq.status is Status.DECODING]
        budget = self.cfg.max_num_batched_tokens - len(decoding)
        chunks: list[Work] = []
        for seq in self.running:
            if budget <= 0:
                break
            if seq.status is not Status.PREFILLING:
                continue
            at = start.get(seq.id, seq.n_computed)
            n = self._chunk(seq, at, budget)
            if n == 0 and not chunks and not decoding:
                n = min(budget, self.cfg.max_chunk)    # progress over exactness (tiny budgets)
            if n == 0:
                continue
            alone = self.cfg.tile > 1 and len(seq.prompt) >= self.cfg.tile
            chunks.append(Work(seq, seq.prompt[at:at + n], at, at + n >= len(seq.prompt),
                               alone=alone, on_backend=seq.backend_sampled))
            budget -= n
        k = self._guess_budget(len(decoding), bool(chunks))
        return StepPlan(tuple(attach), tuple([self._decode_work(seq, k) for seq in decoding]
                                             + chunks))

    def _plan_attaches(self) -> list[Attach]:
        """The KV plans of the sequences to attach, and what each plan's
        first choice leaves computed (plan.expected)."""
        seqs, self._to_attach = self._to_attach, []
        if self.cfg.prefix_sharing:
            seqs += self.release_waiters()      # their leader has computed their prefix
        seqs = [s for s in seqs if s.status is Status.PREFILLING]
        if self.cache is None or not seqs:
            return []
        plans = [self.cache.plan_attach(s.id, s.slot, s.prompt, s.kv_src, s.moved) for s in seqs]
        return [Attach(s, p, n) for s, p, n in zip(seqs, plans, expected(plans, self.splicing),
                                                    strict=True)]

    def _guess_budget(self, n_decoding: int, prefilling: bool) -> int:
        """Guesses per decoding sequence this step: none while prompts wait
        to be computed (they come first) and fewer as the batch fills."""
        spec = self.cfg.spec
        if spec.mode is None or prefilling or self._waiting or not n_decoding:
            return 0
        k = min(spec.draft_max, self.cfg.max_num_batched_tokens // n_decoding - 1)
        if spec.mode != "auto":     # auto weighs each row by its measured cost instead
            if n_decoding > self.cfg.spec_seqs:
                return 0
            k = min(k, self.cfg.spec_rows // n_decoding)
        return k if k >= spec.draft_min else 0

    def _decode_work(self, seq: Sequence, k: int) -> Work:
        cap = k if self.cfg.spec.mode == "auto" else seq.spec_cap
        room = min(k, cap, seq.max_new - len(seq.output) - 1,
                   self.cfg.n_ctx_seq - len(seq.prompt) - len(seq.output) - 1)
        if room < self.cfg.spec.draft_min or seq.backend_sampled:
            room = 0        # a chain in the graph samples one row per sequence
        return Work(seq, [seq.output[-1]], seq.n_computed, True, room=room, decode=True,
                    on_backend=seq.backend_sampled)

    def _chunk(self, seq: Sequence, at: int, budget: int) -> int:
        """How many prompt tokens to compute now, from `at`: all that are
        left if they fit, else a cut that leaves both sides at least a tile
        (0: none fits)."""
        rest = len(seq.prompt) - at
        cap = min(budget, self.cfg.max_chunk)
        if rest <= cap:
            return rest
        if len(seq.prompt) < self.cfg.tile:
            return cap
        n = min(cap, rest - self.cfg.tile)
        return n if n >= self.cfg.tile else 0

    def parked_slots(self) -> dict[int, list[int]]:
        """Parked slots, least recently used first, with the tokens in their KV."""
        return self.slots.parked_slots()

    def is_free(self, slot: int) -> bool:
        return self.slots.is_free(slot)


def split_work(work: list[Work]) -> tuple[list[Work], list[Work]] | None:
    """Two halves of a step's work that is worth retrying smaller: by
    items, or a lone prompt chunk by tokens. None when it is one token
    already."""
    if len(work) > 1:
        mid = len(work) // 2
        return work[:mid], work[mid:]
    w = work[0]
    if w.draft:         # retry without the guesses: a step of one token
        return [replace(w, tokens=w.tokens[:1], draft=[])], []
    if len(w.tokens) < 2:
        return None
    mid = len(w.tokens) // 2
    return ([replace(w, tokens=w.tokens[:mid], sample=False)],
            [replace(w, tokens=w.tokens[mid:], pos=w.pos + mid)])
