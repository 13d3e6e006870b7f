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
new system prompt thus compute it once."""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass

from llmctl.errors import QueueFull
from llmctl.runtime.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_queue: int = 256
    prefix_sharing: bool = False
    min_share: int = 32         # shorter prefixes are not worth a copy or a wait

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1:
            raise ValueError("max_num_seqs must be >= 1")
        if self.max_num_batched_tokens < self.max_num_seqs + 1:
            raise ValueError("max_num_batched_tokens must exceed max_num_seqs")


@dataclass
class Work:
    seq: Sequence
    tokens: list[int]
    pos: int            # position of tokens[0] in the sequence
    sample: bool        # this chunk ends the known tokens: sample after it


class Scheduler:
    def __init__(self, cfg: SchedulerConfig):
        self.cfg = cfg
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.free_slots = list(range(cfg.max_num_seqs - 1, -1, -1))
        self.parked: OrderedDict[int, list[int]] = OrderedDict()   # slot -> tokens in its KV

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.cfg.max_queue:
            raise QueueFull(f"server busy: {len(self.waiting)} requests already waiting")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self) -> list[Sequence]:
        """Move waiting sequences into slots, oldest first. A free slot or a
        parked one (evicted least recently used) is taken; a parked slot
        whose tokens best match the prompt is preferred."""
        admitted = []
        while self.waiting and (self.free_slots or self.parked):
            seq = self.waiting.popleft()
            seq.slot, n_in_place = self._take_slot(seq.prompt)
            seq.kv_src = (seq.slot, n_in_place)
            seq.status = Status.RUNNING
            self.running.append(seq)
            if self.cfg.prefix_sharing:
                self._plan_prefix(seq)
            admitted.append(seq)
        return admitted

    def _take_slot(self, prompt: list[int]) -> tuple[int, int]:
        best, best_n = -1, 0
        for slot, tokens in self.parked.items():
            n = usable_prefix(tokens, prompt)
            if n > best_n:
                best, best_n = slot, n
        if best_n >= self.cfg.min_share:
            del self.parked[best]
            return best, best_n
        if self.free_slots:
            # Lowest id first: llama.cpp packs only runs of consecutive seq
            # ids into one ubatch, so compact slots mean fewer, fuller ubatches.
            slot = min(self.free_slots)
            self.free_slots.remove(slot)
            return slot, 0
        slot, _ = self.parked.popitem(last=False)
        return slot, 0

    def _plan_prefix(self, seq: Sequence) -> None:
        """Pick the longest computed prefix to reuse now, or a leader to wait
        for when one is prefilling a clearly longer shared prefix."""
        src, n = seq.kv_src
        leader, target = None, 0
        for other in self.running:
            if other is seq or other.wait_for is not None:
                continue
            shared = usable_prefix(other.tokens, seq.prompt)
            have = min(shared, other.n_computed)
            if have > n and have >= self.cfg.min_share:
                src, n = other.slot, have
            if not other.prefilled and shared - have >= self.cfg.min_share and shared > target:
                leader, target = other, shared
        for slot, tokens in self.parked.items():
            have = usable_prefix(tokens, seq.prompt)
            if have > n and have >= self.cfg.min_share:
                src, n = slot, have
        seq.kv_src = (src, n) if n else (seq.slot, 0)
        if leader is not None and target >= n + self.cfg.min_share:
            seq.wait_for, seq.wait_until = leader, target

    def release_waiters(self) -> list[Sequence]:
        """Sequences whose leader has computed what they wait for (or is
        gone); their prefix is planned again from what exists now."""
        ready = []
        for seq in self.running:
            lead = seq.wait_for
            if lead is None:
                continue
            if lead.status is Status.RUNNING and lead.n_computed < seq.wait_until:
                continue
            seq.wait_for = None
            src, n = seq.kv_src
            if src != seq.slot:
                seq.kv_src = (seq.slot, 0)
            self._plan_prefix(seq)
            ready.append(seq)
        return ready

    def schedule(self) -> list[Work]:
        """Plan one llama_decode call."""
        budget = self.cfg.max_num_batched_tokens
        plan: list[Work] = []
        for seq in self.running:
            if seq.prefilled and seq.output:
                plan.append(Work(seq, [seq.output[-1]], seq.n_computed, True))
                budget -= 1
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.prefilled and seq.wait_for is None:
                chunk = seq.next_chunk(budget)
                done = seq.n_computed + len(chunk) >= len(seq.prompt)
                plan.append(Work(seq, chunk, seq.n_computed, done))
                budget -= len(chunk)
        return plan

    def finish(self, seq: Sequence, reason: str, park: list[int] | None = None) -> None:
        """Release the slot: park it with `park`, the tokens whose KV it still
        holds, or free it (then its KV is the engine's to clear)."""
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        if seq in self.running:
            self.running.remove(seq)
            if park is not None and len(park) >= self.cfg.min_share:
                self.parked[seq.slot] = park
            else:
                self.free_slots.append(seq.slot)
        elif seq in self.waiting:
            self.waiting.remove(seq)

    def should_park(self, seq: Sequence) -> bool:
        return (self.cfg.prefix_sharing and seq.wait_for is None
                and seq.n_computed >= self.cfg.min_share)

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
