"""The runner: carries a StepPlan out with llama.cpp and returns what came
of it (plan.py). It attaches new sequences' KV through the KV manager,
runs the step's llama_decode calls, and samples, checking any guesses
(speculation/proposer.py's check_guesses) and dropping the KV of those
that did not hold. It changes no sequence's state: the scheduler's update
applies the result.

Failures stay with the sequence that caused them: a sampling error fails
that request only, and a batch llama.cpp has no KV room for is retried in
halves, as llama-server does. ctypes releases the GIL inside
llama_decode, so callers stay responsive while the engine computes."""

from __future__ import annotations

import logging
import random

from llmctl.errors import DecodeError
from llmctl.runtime.engine.kv import KvManager
from llmctl.runtime.engine.logprobs import TokenLogprob, token_logprob
from llmctl.runtime.engine.plan import Attached, Sampled, StepPlan, StepResult, Work
from llmctl.runtime.engine.scheduler import split_work
from llmctl.runtime.engine.sequence import Sequence
from llmctl.runtime.llama import LlamaContext, LlamaModel, Sampler, backend_eligible
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.speculation.proposer import check_guesses

log = logging.getLogger("llmctl.engine")


class Runner:
    """Runs plans on `ctx` for `model`: one sampler chain per open
    sequence, each request's grammar work under `budget`, chains run in
    the graph where `backend_sampling` allows."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, kv: KvManager,
                 budget: GrammarBudget, backend_sampling: bool):
        self.model, self.ctx, self.kv = model, ctx, kv
        self.budget, self.backend_sampling = budget, backend_sampling
        self._samplers: dict[int, Sampler] = {}
        # Sequences whose attached KV differed from the plan's first
        # choice (a disk state unreadable or refused): their rows waited.
        self.replanned = 0

    def open(self, seq: Sequence) -> bool:
        """Make the sequence's sampler chain; returns whether it runs in
        llama.cpp's graph. Raises what Sampler raises (a bad grammar)."""
        seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(32)
        sampler = self._samplers[seq.id] = Sampler(self.model, seq.params, seed, self.budget)
        if self.backend_sampling and backend_eligible(seq.params):
            return sampler.attach(self.ctx, seq.slot)
        return False

    def close(self, seq: Sequence) -> None:
        """Free the sequence's sampler chain (a no-op once done)."""
        sampler = self._samplers.pop(seq.id, None)
        if sampler is not None:
            sampler.close()

    def run(self, plan: StepPlan) -> StepResult:
        """The plan's KV attached, then its rows decoded and sampled. A
        new sequence whose KV came out other than planned computes
        nothing this step (the next plan starts from what it holds)."""
        result = StepResult()
        outcomes = self.kv.attach([a.plan for a in plan.attach])
        waiting: set[int] = set()
        for a, got in zip(plan.attach, outcomes, strict=True):
            result.attached[a.plan.seq_id] = got
            if not (isinstance(got, Attached) and got.n_computed == a.expect):
                waiting.add(a.plan.seq_id)
                self.replanned += isinstance(got, Attached)
        work = [w for w in plan.work if w.seq.id not in waiting]
        shared = [w for w in work if not w.alone]
        # One call for the decoding rows and short prompts' chunks, then
        # one per chunk marked `alone` (the tile rule's, which must not
        # share a ubatch). Each call's logits are consumed before the next.
        for group in ([shared] if shared else []) + [[w] for w in work if w.alone]:
            self._decode_call(group, result)
        return result

    def _decode_call(self, work: list[Work], result: StepResult) -> None:
        """One llama_decode, then a sample per finished chunk. With no KV
        room (rc=1, the memory left as it was) the work is split in halves."""
        try:
            rows = self.ctx.decode([(w.seq.slot, w.tokens, w.pos,
                                     (1 + len(w.draft)) if w.sample else 0) for w in work])
        except DecodeError as e:
            halves = split_work(work) if e.rc == 1 else None
            if halves is None:
                for w in work:
                    result.of(w.seq).error = e
                return
            log.debug("llama_decode found no KV room for %d items; retrying in halves", len(work))
            for half in halves:
                live = [w for w in half if result.of(w.seq).error is None]
                if live:
                    self._decode_call(live, result)
            return
        for w, row in zip(work, rows, strict=False):
            try:
                self._advance(w, row, result)
            except Exception as e:
                log.warning("request %d failed: %s: %s", w.seq.id, type(e).__name__, e)
                result.of(w.seq).error = e

    def _advance(self, w: Work, row: int, result: StepResult) -> None:
        seq, r = w.seq, result.of(w.seq)
        if not w.draft:
            r.computed += len(w.tokens)
            if w.sample and not seq.cancelled:
                r.sampled.append(self._sample(seq, row))
            return
        # A check of guesses: the tokens plain decoding would give. The KV
        # of the guesses that did not hold is dropped before anything
        # else can read it.
        r.computed += 1
        if seq.cancelled:
            self.kv.keep(seq.slot, w.pos + 1)
            return
        r.drafted = len(w.draft)
        r.sampled = [self._sampled(token, lp)
                     for token, lp in check_guesses(w.draft, lambda i: self._pick(seq, row + i))]
        self.kv.keep(seq.slot, w.pos + len(r.sampled))

    def _pick(self, seq: Sequence, row: int) -> tuple[int, TokenLogprob | None]:
        token = self._samplers[seq.id].sample(self.ctx, row)
        n_top = seq.params.logprobs
        return token, (None if n_top is None else
                       token_logprob(self.ctx.logits(row), token, n_top, self.model.piece))

    def _sample(self, seq: Sequence, row: int) -> Sampled:
        return self._sampled(*self._pick(seq, row))

    def _sampled(self, token: int, lp: TokenLogprob | None) -> Sampled:
        return Sampled(token, self.model.piece(token), self.model.is_eog(token), lp)

    def close_all(self) -> None:
        for sampler in self._samplers.values():
            sampler.close()
        self._samplers.clear()
