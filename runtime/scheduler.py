"""Who runs next, and with how many tokens. Plain Python with no llama.cpp
in sight, so every decision is unit-tested without a model.

Each step every decoding sequence gets one token, then prompt chunks fill
the rest of the token budget, oldest request first. Feeding prompts one
after another (rather than a slice of each) makes the first request's first
token come soonest, and never stalls running streams for longer than one
budget's worth of prefill."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from llmctl.errors import QueueFull
from llmctl.runtime.sequence import Sequence, Status


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_queue: int = 256

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

    def add(self, seq: Sequence) -> None:
        if len(self.waiting) >= self.cfg.max_queue:
            raise QueueFull(f"server busy: {len(self.waiting)} requests already waiting")
        self.waiting.append(seq)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def admit(self, seq_filter=None) -> list[Sequence]:
        """Move waiting sequences into free slots, oldest first."""
        admitted = []
        while self.waiting and self.free_slots:
            seq = self.waiting.popleft()
            seq.slot = self.free_slots.pop()
            seq.status = Status.RUNNING
            self.running.append(seq)
            admitted.append(seq)
        return admitted

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
            if not seq.prefilled:
                chunk = seq.next_chunk(budget)
                done = seq.n_computed + len(chunk) >= len(seq.prompt)
                plan.append(Work(seq, chunk, seq.n_computed, done))
                budget -= len(chunk)
        return plan

    def finish(self, seq: Sequence, reason: str) -> None:
        """Release the slot; the sequence's KV is the engine's to clear."""
        seq.status = Status.FINISHED
        seq.finish_reason = seq.finish_reason or reason
        if seq in self.running:
            self.running.remove(seq)
            self.free_slots.append(seq.slot)
        elif seq in self.waiting:
            self.waiting.remove(seq)

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
