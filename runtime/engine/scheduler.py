"""Who runs next, and with how many tokens. Plain Python with no llama.cpp
in sight, so every decision is unit-tested without a model.

Each step every decoding sequence gets one token, then prompt chunks fill
the rest of the token budget, oldest request first. Feeding prompts one
after another (rather than a slice of each) makes the first request's first
token come soonest, and never stalls running streams for longer than one
budget's worth of prefill.

With prefix sharing on, a finished sequence's slot is parked with its KV
(least recently used first out) instead of being freed, and each admitted
sequence is told where the longest computed prefix of its prompt lives: in
its own (parked) slot, in another slot to copy from, or in a leader that is
still prefilling it, in which case it waits (holding its slot, computing
nothing) until the leader has computed the shared part. N requests sharing a
new system prompt thus compute it once.

Prompts are cut so that a token's KV and logits never depend on whether its
prefix came from the cache. ggml's CPU flash attention computes a chunk of
at least `tile` (64) query rows with its tiled kernel and a shorter one row
by row, and the two round differently (measured: a 63-row chunk changes the
logits, 64 or more in any split do not). So with `tile` > 1, a prompt of at
least `tile` tokens is only ever computed in chunks of at least `tile`
rows: a reused prefix leaves `tile` tokens to compute, a chunk cut for the
budget leaves `tile` for later, and only prompt tokens are reused (a
generated token was computed in a one-row chunk). A shorter prompt goes row
by row however it is cut, so it is cut freely but reuses nothing."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from llmctl.errors import QueueFull
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.stats import Stats, StatsCollector
from llmctl.runtime.speculation.config import SpecConfig
from llmctl.runtime.speculation.ngram import ngram_draft


@dataclass(frozen=True)
class SchedulerConfig:
    """Limits the scheduler enforces; validated once, in LoadOptions."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_queue: int = 256
    prefix_sharing: bool = False
    min_share: int = 32         # shorter prefixes are not worth a copy or a wait
    # Rows of ggml's flash-attention tile (GGML_FA_TILE_Q); 1: any cut is exact
    # (flash attention off), and generated tokens are reused too.
    tile: int = 64
    max_chunk: int = 512        # llama.cpp's n_ubatch: a longer chunk is cut again there
    spec: SpecConfig = SpecConfig()     # speculation (off by default)
    # Guessed tokens one step may check across all sequences, and the most
    # decoding sequences that speculate at all: a checked row costs compute
    # a full batch no longer has spare (scripts/bench_draft.py on 2 cores:
    # one guess each at 8 sequences ran 0.67x plain decoding).
    spec_rows: int = 8
    spec_seqs: int = 2
    n_ctx_seq: int = 1 << 30    # a sequence's KV room: guesses must fit it


@dataclass
class Work:
    seq: Sequence
    tokens: list[int]
    pos: int            # position of tokens[0] in the sequence
    sample: bool        # this chunk ends the known tokens: sample after it
    draft: list[int] = field(default_factory=list)  # guesses after tokens[0] (speculation)
    room: int = 0       # guesses a draft model may add (the engine asks it)


class Scheduler:
    """Owns the request lifecycle: the waiting queue, the slots (free, busy
    or parked with KV), each sequence's Status, and the statistics.

    `add`, `cancel`, `counts` and `make_stats` may be called from any
    thread; everything else runs on the engine thread."""

    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self._lock = threading.Lock()       # guards _waiting against add()
        self._waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self._free = list(range(cfg.max_num_seqs - 1, -1, -1))
        self._parked: OrderedDict[int, list[int]] = OrderedDict()   # slot -> tokens in its KV
        self._stats = StatsCollector()

    # ---- any thread -------------------------------------------------------------

    def add(self, seq: Sequence) -> None:
        """Queue a request. Raises QueueFull when more than `max_queue`
        requests would wait beyond the slots (free or parked) that can take
        them at the next step."""
        with self._lock:
            queued = len(self._waiting) - len(self._free) - len(self._parked)
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
        return len(self.running), len(self._waiting), len(self._parked), len(self._free)

    def record_spec(self, seq: Sequence, drafted: int, accepted: int) -> None:
        """Count a speculating step and set the sequence's next guess cap:
        a checked row costs a fifth to a third of a decode step here
        (scripts/bench_rows.py, 1.5B on 2 cores: 9 rows cost 2.6-3.6 steps),
        so a sequence whose guesses keep failing checks one at a time, and
        one whose guesses hold doubles its cap."""
        seq.spec_cap = 2 * accepted + 1
        self._stats.record_spec(drafted, accepted)

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
        while self._free or self._parked:
            with self._lock:
                if not self._waiting:
                    break
                seq = self._waiting.popleft()
            seq.slot, n_in_place = self._take_slot(seq.prompt)
            seq.kv_src = (seq.slot, n_in_place)
            seq.status = Status.PREFILLING
            self.running.append(seq)
            if self.cfg.prefix_sharing:
                self._plan_prefix(seq)
            admitted.append(seq)
        return admitted

    def _take_slot(self, prompt: list[int]) -> tuple[int, int]:
        best, best_n = -1, 0
        for slot, tokens in self._parked.items():
            n = self._reusable(tokens, prompt)
            if n > best_n:
                best, best_n = slot, n
        if best_n >= self.cfg.min_share:
            del self._parked[best]
            return best, best_n
        if self._free:
            # Lowest id first: llama.cpp packs only runs of consecutive seq
            # ids into one ubatch, so compact slots mean fewer, fuller ubatches.
            slot = min(self._free)
            self._free.remove(slot)
            return slot, 0
        slot, _ = self._parked.popitem(last=False)
        return slot, 0

    def _plan_prefix(self, seq: Sequence) -> None:
        """Pick the longest computed prefix to reuse now, or a leader to wait
        for when one is prefilling a clearly longer shared prefix."""
        src, n = seq.kv_src
        leader, target = None, 0
        for other in self.running:
            if other is seq or other.status is Status.WAITING_PREFIX:
                continue
            shared = self._reusable(other.prompt if self.cfg.tile > 1 else other.tokens, seq.prompt)
            have = min(shared, other.n_computed)
            if have > n and have >= self.cfg.min_share:
                src, n = other.slot, have
            if (other.status is Status.PREFILLING and shared - have >= self.cfg.min_share
                    and shared > target):
                leader, target = other, shared
        for slot, tokens in self._parked.items():
            have = self._reusable(tokens, seq.prompt)
            if have > n and have >= self.cfg.min_share:
                src, n = slot, have
        seq.kv_src = (src, n) if n else (seq.slot, 0)
        if leader is not None and target >= n + self.cfg.min_share:
            seq.wait_for, seq.wait_until = leader, target
            seq.status = Status.WAITING_PREFIX

    def _reusable(self, have: list[int], prompt: list[int]) -> int:
        return exact_reuse(usable_prefix(have, prompt), len(prompt), self.cfg.tile)

    def release_waiters(self) -> list[Sequence]:
        """Sequences whose leader has computed what they wait for (or is
        gone); their prefix is planned again from what exists now."""
        ready = []
        for seq in self.running:
            lead = seq.wait_for
            if seq.status is not Status.WAITING_PREFIX or lead is None:
                continue
            if lead.status.has_slot and lead.n_computed < seq.wait_until:
                continue
            seq.wait_for = None
            seq.status = Status.PREFILLING
            src, n = seq.kv_src
            if src != seq.slot:
                seq.kv_src = (seq.slot, 0)
            self._plan_prefix(seq)
            if seq.status is Status.PREFILLING:
                ready.append(seq)
        return ready

    # ---- engine thread: steps ---------------------------------------------------

    def schedule(self) -> list[Work]:
        """Plan one llama_decode call: a token per decoding sequence, then
        prompt chunks, oldest first, up to the token budget.

        With a tile rule, a chunk of a long prompt runs with neither of its
        neighbouring slots in the step (they wait a step): llama.cpp's equal
        split puts consecutive seq ids in one ubatch, each with as many rows
        as the shortest has, which would cut the chunk's first row off."""
        decoding = [seq for seq in self.running if seq.status is Status.DECODING]
        budget = self.cfg.max_num_batched_tokens - len(decoding)
        chunks: list[Work] = []
        taken: set[int] = set()     # slots with a chunk
        alone: set[int] = set()     # ...that must not share a ubatch
        for seq in self.running:
            if budget <= 0:
                break
            isolate = self.cfg.tile > 1 and len(seq.prompt) >= self.cfg.tile
            near = {seq.slot - 1, seq.slot + 1}
            if seq.status is not Status.PREFILLING or near & alone or (isolate and near & taken):
                continue
            n = self._chunk(seq, budget)
            if n == 0 and not chunks and not decoding:
                n = min(budget, self.cfg.max_chunk)    # progress over exactness (tiny budgets)
            if n == 0:
                continue
            done = seq.n_computed + n >= len(seq.prompt)
            chunks.append(Work(seq, seq.prompt[seq.n_computed:seq.n_computed + n], seq.n_computed, done))
            budget -= n
            taken.add(seq.slot)
            if isolate:
                alone.add(seq.slot)
        skip = {slot + d for slot in alone for d in (-1, 1)}
        steps = [seq for seq in decoding if seq.slot not in skip]
        k = self._draft_len(len(steps), bool(chunks))
        return [self._decode_work(seq, k) for seq in steps] + chunks

    def _draft_len(self, n_decoding: int, prefilling: bool) -> int:
        """Guesses per decoding sequence this step: none while prompts wait
        to be computed (they come first) and fewer as the batch fills."""
        spec = self.cfg.spec
        if (spec.mode is None or prefilling or self._waiting or not n_decoding
                or n_decoding > self.cfg.spec_seqs):
            return 0
        k = min(spec.draft_max, self.cfg.spec_rows // n_decoding,
                self.cfg.max_num_batched_tokens // n_decoding - 1)
        return k if k >= spec.draft_min else 0

    def _decode_work(self, seq: Sequence, k: int) -> Work:
        room = min(k, seq.spec_cap, seq.max_new - len(seq.output) - 1,
                   self.cfg.n_ctx_seq - len(seq.prompt) - len(seq.output) - 1)
        if room < self.cfg.spec.draft_min:
            room = 0
        if self.cfg.spec.mode == "draft":
            return Work(seq, [seq.output[-1]], seq.n_computed, True, room=room)
        draft = ngram_draft(seq.tokens, room) if room else []
        return Work(seq, [seq.output[-1], *draft], seq.n_computed, True, draft)

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

    def finish(self, seq: Sequence, reason: str, park: list[int] | None = None) -> None:
        """End a request and count it. Its slot is parked with `park`, the
        tokens whose KV it still holds, or freed (then its KV is the
        engine's to clear)."""
        if seq.status is Status.FINISHED:
            return
        had_slot = seq.status.has_slot
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        seq.finished_at = time.perf_counter()
        if had_slot:
            self.running.remove(seq)
            if park is not None and self.cfg.tile > 1:
                park = park[:len(seq.prompt)] if len(seq.prompt) >= self.cfg.tile else []
            if park is not None and len(park) >= self.cfg.min_share:
                self._parked[seq.slot] = park
            else:
                self._free.append(seq.slot)
        else:
            with self._lock:
                if seq in self._waiting:
                    self._waiting.remove(seq)
        outcome = reason if reason in ("error", "cancelled") else "ok"
        first = seq.first_token_at
        self._stats.record(outcome, len(seq.prompt), seq.n_cached,
                           seq.n_cached if seq.cached_from_disk else 0, len(seq.output),
                           None if first is None else first - seq.arrived,
                           0.0 if first is None else seq.finished_at - first)

    def should_park(self, seq: Sequence) -> bool:
        return (self.cfg.prefix_sharing and seq.status is not Status.WAITING_PREFIX
                and seq.n_computed >= self.cfg.min_share)

    def parked_slots(self) -> dict[int, list[int]]:
        """Parked slots, least recently used first, with the tokens in their KV."""
        return dict(self._parked)

    def is_free(self, slot: int) -> bool:
        return slot in self._free

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


def exact_reuse(n: int, n_prompt: int, tile: int) -> int:
    """How much of an `n`-token computed prefix a prompt of `n_prompt`
    tokens may reuse and still get the KV it would compute itself (see the
    module docstring): all of it with `tile` 1; else none for a prompt
    shorter than a tile, and never the last tile's worth."""
    if tile <= 1:
        return n
    return 0 if n_prompt < tile else min(n, n_prompt - tile)


def usable_prefix(have: list[int], prompt: list[int]) -> int:
    """Tokens of `prompt` that `have` starts with, leaving the last prompt
    token to compute: its logits are what the first sample needs."""
    limit = min(len(have), len(prompt) - 1)
    if limit <= 0:
        return 0
    if have[:limit] == prompt[:limit]:
        return limit
    lo, hi = 0, limit          # have[:lo] matches, have[:hi] does not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if have[lo:mid] == prompt[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo
