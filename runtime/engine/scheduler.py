"""Who runs next, and with how many tokens. Plain Python with no llama.cpp
in sight, so every decision is unit-tested without a model.

Each step every decoding sequence gets one token, then prompt chunks fill
the rest of the token budget, oldest request first. Feeding prompts one
after another (rather than a slice of each) makes the first request's first
token come soonest, and never stalls running streams for longer than one
budget's worth of prefill.

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
import time
from collections import deque
from dataclasses import dataclass, field

from llmctl.errors import QueueFull
from llmctl.runtime.batching import CPU_STEP_TOKENS, ENGINE_MAX_QUEUE, SERVE_MAX_NUM_SEQS, UBATCH_TOKENS
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.slots import SlotTable
from llmctl.runtime.engine.stats import Stats, StatsCollector
from llmctl.runtime.prefix_cache.rule import TILE
from llmctl.runtime.speculation.spec_config import SpecConfig


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


@dataclass
class Work:
    """One sequence's share of a step: tokens to compute from `pos`."""

    seq: Sequence
    tokens: list[int]
    pos: int            # position of tokens[0] in the sequence
    sample: bool        # this chunk ends the known tokens: sample after it
    draft: list[int] = field(default_factory=list)  # guesses after tokens[0], a proposer's
    room: int = 0       # guesses the budget allows this step (speculation)
    decode: bool = False  # a decoding sequence's step (its last token, and any draft)
    alone: bool = False   # a tile-rule chunk: computed in a llama_decode call of its own


class Scheduler:
    """Owns the request lifecycle: the waiting queue, each sequence's
    Status, the slot table, the token budget and the statistics.

    `add`, `cancel`, `counts` and `make_stats` may be called from any
    thread; everything else runs on the engine thread."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
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

    @staticmethod
    def record_spec(seq: Sequence, accepted: int) -> None:
        """Set the sequence's next guess cap after a check under a forced
        mode (auto measures instead: speculation/adaptive.py): a checked
        row costs a good part of a decode step (docs/speculation.md), so a
        sequence whose guesses keep failing checks one at a time, and one
        whose guesses hold doubles its cap."""
        seq.spec_cap = 2 * accepted + 1

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
            if self.cfg.prefix_sharing:
                self.slots.plan_prefix(seq, self.running)
            admitted.append(seq)
        return admitted

    def release_waiters(self) -> list[Sequence]:
        """Sequences whose leader has computed what they wait for (or is
        gone), planned again: SlotTable.release_waiters."""
        return self.slots.release_waiters(self.running)

    # ---- engine thread: steps ---------------------------------------------------

    def schedule(self) -> list[Work]:
        """Plan one step: a token per decoding sequence, then prompt chunks,
        oldest first, up to the token budget.

        With a tile rule, a chunk of a long prompt is marked `alone`: the
        engine gives it a llama_decode call of its own. With one KV stream
        per sequence, llama.cpp's equal split would put it in a ubatch with
        the neighbouring slots' decode rows, each with as many rows as the
        shortest has, and so compute its first row by another kernel. A call
        of its own keeps the neighbours decoding in the same step."""
        decoding = [seq for seq in self.running if seq.status is Status.DECODING]
        budget = self.cfg.max_num_batched_tokens - len(decoding)
        chunks: list[Work] = []
        for seq in self.running:
            if budget <= 0:
                break
            if seq.status is not Status.PREFILLING:
                continue
            n = self._chunk(seq, budget)
            if n == 0 and not chunks and not decoding:
                n = min(budget, self.cfg.max_chunk)    # progress over exactness (tiny budgets)
            if n == 0:
                continue
            done = seq.n_computed + n >= len(seq.prompt)
            alone = self.cfg.tile > 1 and len(seq.prompt) >= self.cfg.tile
            chunks.append(Work(seq, seq.prompt[seq.n_computed:seq.n_computed + n],
                               seq.n_computed, done, alone=alone))
            budget -= n
        k = self._guess_budget(len(decoding), bool(chunks))
        return [self._decode_work(seq, k) for seq in decoding] + chunks

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
        return Work(seq, [seq.output[-1]], seq.n_computed, True, room=room, decode=True)

    def _chunk(self, seq: Sequence, budget: int) -> int:
        """How many prompt tokens to compute now: all that are left if they
        fit, else a cut that leaves both sides at least a tile (0: none fits)."""
        rest = len(seq.prompt) - seq.n_computed
        cap = min(budget, self.cfg.max_chunk)
        if rest <= cap:
            return rest
        if len(seq.prompt) < self.cfg.tile:
            return cap
        n = min(cap, rest - self.cfg.tile)
        return n if n >= self.cfg.tile else 0

    @staticmethod
    def on_computed(seq: Sequence, n: int) -> None:
        """`n` more of the sequence's tokens are now in its KV."""
        seq.n_computed += n

    @staticmethod
    def on_token(seq: Sequence, token: int) -> None:
        """A token was sampled: the sequence decodes from now on."""
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        seq.output.append(token)
        seq.status = Status.DECODING

    def finish(self, seq: Sequence, reason: str, park: list[int] | None = None) -> float:
        """End a request and count it; returns when it finished. Its slot is
        parked with `park`, the tokens whose KV it still holds, or freed
        (then its KV is the engine's to clear)."""
        if seq.status is Status.FINISHED and seq.finished_at is not None:
            return seq.finished_at
        had_slot = seq.status.has_slot
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        seq.finished_at = now = time.perf_counter()
        if had_slot:
            self.running.remove(seq)
            self.slots.give_back(seq, park)
        else:
            with self._lock:
                if seq in self._waiting:
                    self._waiting.remove(seq)
        outcome = reason if reason in ("error", "cancelled") else "ok"
        first = seq.first_token_at
        self._stats.record(outcome, len(seq.prompt), seq.n_cached,
                           seq.n_cached if seq.cached_from_disk else 0, len(seq.output),
                           None if first is None else first - seq.arrived,
                           0.0 if first is None else now - first)
        return now

    def should_park(self, seq: Sequence) -> bool:
        return (self.cfg.prefix_sharing and seq.status is not Status.WAITING_PREFIX
                and seq.n_computed > 0)

    def parked_slots(self) -> dict[int, list[int]]:
        """Parked slots, least recently used first, with the tokens in their KV."""
        return self.slots.parked_slots()

    def is_free(self, slot: int) -> bool:
        return self.slots.is_free(slot)

    @staticmethod
    def stop_reason(seq: Sequence, token: int, is_eog: bool, n_ctx_seq: int) -> str | None:
        """Why a sequence ends after sampling `token`, or None to go on."""
        if is_eog and not seq.params.ignore_eos:
            return "stop"
        if len(seq.output) >= seq.max_new:
            return "length"
        if len(seq.prompt) + len(seq.output) >= n_ctx_seq:
            return "length"
        return None

