"""The scheduler's other half: applying what a step did. `update(plan,
result)` is where a running sequence's state changes: its new KV, the
tokens it sampled and the text they release, and its end, with the events
that tell its caller; `end` ends one outside a step (cancelled, failed).
What the engine must then do with llama.cpp (save a prompt's state, keep,
park or clear a slot) comes back as a StepOutput. Plain Python."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import TYPE_CHECKING

from llmctl.errors import LlmctlError
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, Usage
from llmctl.runtime.engine.logprobs import TokenLogprob
from llmctl.runtime.engine.output import Output
from llmctl.runtime.engine.plan import (
    Attached,
    Ending,
    Sampled,
    SeqResult,
    StepOutput,
    StepPlan,
    StepResult,
    Work,
)
from llmctl.runtime.engine.repetition import LoopDetector
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.slots import SlotTable
from llmctl.runtime.engine.stats import StatsCollector
from llmctl.runtime.speculation.spec_config import next_cap

if TYPE_CHECKING:
    from llmctl.runtime.engine.scheduler import SchedulerConfig

log = logging.getLogger("llmctl.engine")


class Lifecycle:
    """Scheduler's methods that apply a step's result and end requests."""

    cfg: SchedulerConfig
    running: list[Sequence]
    slots: SlotTable
    _lock: threading.Lock
    _waiting: deque[Sequence]
    _stats: StatsCollector
    _outputs: dict[int, Output]

    def update(self, plan: StepPlan, result: StepResult) -> StepOutput:
        """Apply what the runner did with `plan`. A sequence the step
        failed ends with its error; the others go on."""
        out = StepOutput()
        for a in plan.attach:
            got = result.attached.get(a.seq.id)
            if isinstance(got, Exception):
                self._end_into(out, a.seq, "error", got)
            elif got is not None:
                self._attached(a.seq, got)
        for w in plan.work:
            r = result.seqs.get(w.seq.id)
            if r is None or not w.seq.status.has_slot:
                continue        # held back (its KV came out other than planned), or ended
            if r.error is not None:
                self._end_into(out, w.seq, "error", r.error)
                continue
            try:
                self._apply(w, r, out)
            except Exception as e:     # detokenizing: this request alone
                log.warning("request %d failed: %s: %s", w.seq.id, type(e).__name__, e)
                self._end_into(out, w.seq, "error", e)
        return out

    @staticmethod
    def _attached(seq: Sequence, got: Attached) -> None:
        seq.moved = None
        seq.n_computed, seq.n_cached = got.n_computed, got.n_cached
        seq.cached_from_disk = got.from_disk

    def _apply(self, w: Work, r: SeqResult, out: StepOutput) -> None:
        seq = w.seq
        seq.n_computed += r.computed
        if r.drafted:
            # A forced mode's cap (auto keeps its own: adaptive.py).
            seq.spec_cap = next_cap(r.kept, probe=1)
        if r.sampled and not seq.output and self.cfg.prefix_sharing:
            out.prefilled.append(seq)       # its prompt's state, for the disk
        for i, s in enumerate(r.sampled):
            if i:
                seq.n_computed += 1         # the guess it confirmed
            self._accept(seq, s, out)
            if seq.status is Status.FINISHED:
                return

    def _accept(self, seq: Sequence, s: Sampled, out: StepOutput) -> None:
        self.on_token(seq, s.token)
        reason = self.stop_reason(seq, s.token, s.eog, self.cfg.n_ctx_seq)
        if not (s.eog and reason == "stop"):
            event, hit = self._outputs[seq.id].feed(s)
            if event is not None:
                out.events.append((seq, event))
            if hit:
                seq.finish_reason, reason = "stop", "stop"
                seq.stop_string = self._outputs[seq.id].matched
        if reason:
            self._end_into(out, seq, reason)

    def _end_into(self, out: StepOutput, seq: Sequence, reason: str,
                  error: BaseException | None = None) -> None:
        ending = self.end(seq, reason, error)
        out.ended.append(ending)
        out.events.append((seq, ending.event))

    def end(self, seq: Sequence, reason: str, error: BaseException | None = None) -> Ending:
        """End a request for `reason` ("stop", "length", "loop", "cancelled", or
        "error" with `error`): its text held back released (but a
        cancelled one's), its slot parked or freed, and the event that
        tells its caller. The engine then keeps, parks or clears its KV."""
        output = self._outputs.pop(seq.id, None)
        slot = seq.slot if seq.status.has_slot else None
        if error is not None:
            err = error if isinstance(error, LlmctlError) else \
                LlmctlError(f"generation failed: {type(error).__name__}: {error}")
            self.finish(seq, "error")
            return Ending(seq, slot, None, ErrorEvent(err))
        tail, tail_logprobs = "", list[TokenLogprob]()
        if output is not None and reason != "cancelled":
            tail, tail_logprobs = output.tail()
        park = seq.tokens[:seq.n_computed] if slot is not None and self.should_park(seq) else None
        now = self.finish(seq, reason, park)
        first = seq.first_token_at or now
        return Ending(seq, slot, park, FinishEvent(
            reason=seq.finish_reason or reason,
            usage=Usage(len(seq.prompt), len(seq.output), seq.n_cached),
            ttft_s=first - seq.arrived, duration_s=now - seq.arrived,
            decode_s=now - first, tail=tail, logprobs=tail_logprobs, stop=seq.stop_string))

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

    @staticmethod
    def stop_reason(seq: Sequence, token: int, is_eog: bool, n_ctx_seq: int) -> str | None:
        """Why a sequence ends after sampling `token`, or None to go on."""
        if is_eog and not seq.params.ignore_eos:
            return "stop"
        if len(seq.output) >= seq.max_new:
            return "length"
        if len(seq.prompt) + len(seq.output) >= n_ctx_seq:
            return "length"
        if seq.params.loop_guard:
            if seq.loop is None:
                seq.loop = LoopDetector()
            if seq.loop.push(token):
                return "loop"
        return None
