"""The continuous-batching engine: one thread, one llama_context, many
sequences. Requests join the running batch at the next step; every step is
a single llama_decode over all decoding streams plus prompt chunks.

The scheduler decides who runs and owns each request's state; this file
carries its plans out with llama.cpp. Failures stay with the sequence that
caused them: a sampling or detokenizing error fails that request only, and a
batch llama.cpp has no KV room for is retried in halves.

With speculation, a proposer (speculation/) fills in the guesses the
scheduler made room for (speculate.py, which in auto mode also cuts them to
what pays), and the step's one decode checks them (_verify).

ctypes releases the GIL inside llama_decode, so callers (the HTTP event
loop, the chat REPL) stay responsive while the engine computes."""

from __future__ import annotations

import dataclasses
import logging
import random
import threading
import time
from typing import TYPE_CHECKING, Callable, ParamSpec

from llmctl.errors import ContextOverflow, DecodeError, EngineFailed, InvalidParams, LlmctlError
from llmctl.runtime.engine.detok import StopMatcher, Utf8Stream
from llmctl.runtime.engine.events import ErrorEvent, Event, FinishEvent, TokenEvent, Usage
from llmctl.runtime.engine.logprobs import TokenLogprob, token_logprob
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig, Work
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.speculate import Speculation
from llmctl.runtime.engine.stats import Stats
from llmctl.runtime.llama import LlamaContext, LlamaModel, Sampler, backend_eligible, validate_sampling
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.proposer import Proposer, check_guesses

if TYPE_CHECKING:
    from llmctl.runtime.prefix_cache.cache import PrefixCache

log = logging.getLogger("llmctl.engine")

P = ParamSpec("P")


class _Stream:
    """Per-sequence decoding state that lives beside the Sequence."""

    def __init__(self, model: LlamaModel, seq: Sequence, budget: GrammarBudget):
        seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(32)
        self.sampler = Sampler(model, seq.params, seed, budget)
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(seq.params.stop)
        # Log-probabilities of tokens whose text is still held back.
        self.logprobs: list[TokenLogprob] = []


class Engine:
    """Runs requests on one model in `ctx`, its context made for `opts`
    (build.py makes the parts), which the engine owns and closes, with
    `prefix_cache` and `proposer` as they too. Raises EngineFailed from
    `submit` once its thread has died; `alive` and `failure` say so to
    health checks, and `stalled` says when it has work and makes no step.

    `opts.settings` says how long a step may take before the engine counts
    as stalled (engine_stall_s) and bounds each request's grammar work."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, opts: LoadOptions, *,
                 prefix_cache: PrefixCache | None = None, proposer: Proposer | None = None):
        self.model = model
        self.stall_s = opts.settings.engine_stall_s
        self.grammar_budget = GrammarBudget.of(opts.settings)
        # When the engine last finished a step, or last got work while idle.
        self._progress_at = time.monotonic()
        self.flash_attn = opts.use_flash_attn
        self.backend_sampling = bool(opts.backend_sampling)
        self.ctx = ctx
        self.n_ctx_seq = ctx.n_ctx_seq
        self.max_num_seqs = opts.max_num_seqs
        # Deterministic flash attention cuts prompts by its tile so that
        # prefix hits stay bit-exact (prefix_cache/rule.py); else any cut.
        self.scheduler = Scheduler(SchedulerConfig(
            opts.max_num_seqs, opts.step_tokens, opts.max_queue,
            prefix_sharing=prefix_cache is not None, tile=opts.prompt_tile,
            # Runs move only where the prefix cache has a splicer for them.
            min_run=prefix_cache.splicer.min_run if prefix_cache and prefix_cache.splicer else 0,
            spec=opts.spec_config, n_ctx_seq=self.n_ctx_seq))
        self.prefix_cache = prefix_cache
        self.spec = None if proposer is None else Speculation(
            proposer, opts.spec_config.mode == "auto", self.scheduler.collector)
        self.failure: str | None = None
        self._streams: dict[int, _Stream] = {}
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llmctl-engine", daemon=True)
        self._thread.start()

    # ---- called from any thread -------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams,
               emit: Callable[[Event], None]) -> Sequence:
        """Queue a request. Raises (before anything streams) when it can never
        run: InvalidParams for an empty prompt or a bad grammar or logit
        bias, ContextOverflow when it does not fit, QueueFull, or
        EngineFailed."""
        if not prompt:
            raise InvalidParams("the prompt is empty", param="prompt")
        want = params.max_tokens or 1
        if len(prompt) + want > self.n_ctx_seq:
            raise ContextOverflow(
                f"prompt ({len(prompt)} tokens) plus max_tokens ({want}) exceeds the "
                f"context of {self.n_ctx_seq} tokens", param="max_tokens")
        if params.grammar or params.logit_bias:
            validate_sampling(self.model, params)   # a 400 now, not an error mid-stream
        if not self.alive:
            raise EngineFailed(f"the engine has stopped: {self.failure or 'shut down'}")
        max_new = params.max_tokens or (self.n_ctx_seq - len(prompt))
        seq = Sequence(prompt=prompt, params=params, max_new=max_new, emit=emit)
        idle = not self.scheduler.has_work()
        self.scheduler.add(seq)
        if idle:    # an idle spell is no stall; a stuck step keeps its age
            self._progress_at = time.monotonic()
        with self._cv:
            self._cv.notify()
        return seq

    def cancel(self, seq: Sequence) -> None:
        """Cancel a request; it ends at the engine's next step. Raises nothing."""
        self.scheduler.cancel(seq)
        with self._cv:
            self._cv.notify()

    def stats(self) -> Stats:
        """The counters and gauges, with the age of the current step."""
        return dataclasses.replace(self.scheduler.make_stats(), step_age_s=self._step_age())

    def _step_age(self) -> float:
        """Seconds since the last step while there is work; 0 when idle."""
        if not self.scheduler.has_work():
            return 0.0
        return max(0.0, time.monotonic() - self._progress_at)

    def stalled(self) -> str | None:
        """Why the engine counts as wedged: it has had work (running or
        waiting requests) and finished no step for more than `stall_s`
        seconds. None when it is idle or moving."""
        age = self._step_age()
        if age <= self.stall_s:
            return None
        running, waiting, _, _ = self.scheduler.counts()
        return (f"the engine has finished no step for {age:.0f} s (limit {self.stall_s:g} s) "
                f"with {running} running and {waiting} waiting requests")

    @property
    def alive(self) -> bool:
        """Whether the engine thread runs and has neither failed nor been stopped."""
        return self.failure is None and not self._stopping and self._thread.is_alive()

    def close(self) -> None:
        """Stop after the current step; unfinished requests end cancelled and
        queued prefix-cache writes are flushed."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=60)
        self._end_all(lambda seq: self._finish(seq, "cancelled"))
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        if self.spec is not None:
            self.spec.close()
        self.ctx.close()

    # ---- the engine thread ------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                with self._cv:
                    while not (self.scheduler.has_work() or self._stopping):
                        self._cv.wait()
                    if self._stopping:
                        return
                self._step()
                self._progress_at = time.monotonic()
        except BaseException as e:   # a bug in shared state: stop serving, say why
            self.failure = f"{type(e).__name__}: {e}"
            log.exception("engine thread died")
            error = e
            self._end_all(lambda seq: self._fail(seq, error))

    def _step(self) -> None:
        for seq in self.scheduler.take_cancelled():
            self._guard(seq, self._finish, seq, "cancelled")
        self._admit()
        plan = self.scheduler.schedule()
        if not plan:
            return
        if self.spec is None:
            self._decode(plan)
            return
        self.spec.fill(plan)
        start = time.perf_counter()
        self._decode(plan)
        self.spec.timed(plan, time.perf_counter() - start)

    def _guard(self, seq: Sequence, fn: Callable[P, None], *args: P.args, **kwargs: P.kwargs) -> None:
        """Run one sequence's share of a step; its error fails it alone."""
        try:
            fn(*args, **kwargs)
        except Exception as e:
            log.warning("request %d failed: %s: %s", seq.id, type(e).__name__, e)
            self._fail(seq, e)

    def _admit(self) -> None:
        admitted = self.scheduler.admit()
        for seq in admitted:
            self._guard(seq, self._open_stream, seq)
        if self.prefix_cache is not None:
            # Waiters get their KV once their leader has computed the prefix.
            ready = [s for s in admitted if s.status is Status.PREFILLING]
            failed = self.prefix_cache.attach(self.ctx, ready + self.scheduler.release_waiters())
            for seq, e in failed:
                self._fail(seq, e)

    def _open_stream(self, seq: Sequence) -> None:
        stream = self._streams[seq.id] = _Stream(self.model, seq, self.grammar_budget)
        if self.backend_sampling and backend_eligible(seq.params):
            seq.backend_sampled = stream.sampler.attach(self.ctx, seq.slot)

    def _decode(self, plan: list[Work]) -> None:
        """The step's llama_decode calls: one for the decoding rows and
        short prompts' chunks, then one per chunk the scheduler marked
        `alone` (the tile rule's, which must not share a ubatch). Each
        call's logits are consumed before the next overwrites them."""
        shared = [w for w in plan if not w.alone]
        for group in ([shared] if shared else []) + [[w] for w in plan if w.alone]:
            self._decode_call(group)

    def _decode_call(self, plan: list[Work]) -> None:
        """One llama_decode for the plan, then a sample per finished chunk.
        With no KV room (rc=1, the memory left as it was) the plan is split
        in halves, as llama-server does; logits are consumed before the next
        decode overwrites them."""
        try:
            rows = self.ctx.decode([(w.seq.slot, w.tokens, w.pos,
                                     (1 + len(w.draft)) if w.sample else 0) for w in plan])
        except DecodeError as e:
            halves = _split(plan) if e.rc == 1 else None
            if halves is None:
                for w in plan:
                    self._fail(w.seq, e)
                return
            log.debug("llama_decode found no KV room for %d items; retrying in halves", len(plan))
            for half in halves:
                live = [w for w in half if w.seq.status.has_slot]
                if live:
                    self._decode_call(live)
            return
        for w, row in zip(plan, rows, strict=False):
            self._guard(w.seq, self._advance, w, row)

    def _advance(self, w: Work, row: int) -> None:
        seq = w.seq
        if w.draft:
            self._verify(w, row)
            return
        self.scheduler.on_computed(seq, len(w.tokens))
        if not w.sample or seq.cancelled:
            return
        if self.prefix_cache is not None and not seq.output:
            self.prefix_cache.on_prefilled(self.ctx, seq)
        self._accept(seq, *self._sample(seq, row))

    def _sample(self, seq: Sequence, row: int) -> tuple[int, TokenLogprob | None]:
        token = self._streams[seq.id].sampler.sample(self.ctx, row)
        n_top = seq.params.logprobs
        return token, (None if n_top is None else
                       token_logprob(self.ctx.logits(row), token, n_top, self.model.piece))

    def _verify(self, w: Work, row: int) -> None:
        """Check a speculating step (check_guesses), so the tokens are those
        plain decoding would give. The KV of the rejected guesses is dropped
        before anything else can read it."""
        seq = w.seq
        self.scheduler.on_computed(seq, 1)
        if seq.cancelled:
            self.ctx.seq_rm(seq.slot, seq.n_computed, -1)
            return
        sampled = check_guesses(w.draft, lambda i: self._sample(seq, row + i))
        assert self.spec is not None
        self.spec.checked(w, len(sampled) - 1)
        self.scheduler.record_spec(seq, len(sampled) - 1)
        self.ctx.seq_rm(seq.slot, seq.n_computed + len(sampled) - 1, -1)
        for i, (token, lp) in enumerate(sampled):
            if i:
                self.scheduler.on_computed(seq, 1)      # the guess it confirmed
            self._accept(seq, token, lp)
            if seq.status is Status.FINISHED:
                return

    def _accept(self, seq: Sequence, token: int, lp: TokenLogprob | None = None) -> None:
        stream = self._streams[seq.id]
        self.scheduler.on_token(seq, token)
        is_eog = self.model.is_eog(token)
        reason = Scheduler.stop_reason(seq, token, is_eog, self.n_ctx_seq)
        if not (is_eog and reason == "stop"):
            if lp is not None:
                stream.logprobs.append(lp)
            text, hit = stream.stops.feed(stream.utf8.feed(self.model.piece(token)))
            if text:
                seq.emit(TokenEvent(text, token, stream.logprobs))
                stream.logprobs = []
            if hit:
                seq.finish_reason = "stop"
                seq.stop_string = stream.stops.matched
                reason = "stop"
                stream.stops = StopMatcher(())   # drop held text: it was the stop
                stream.logprobs = []             # and these tokens wrote it
        if reason:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        """End a request: release its text held back, park or clear its
        KV, and send its FinishEvent."""
        stream = self._streams.pop(seq.id, None)
        tail, tail_logprobs = "", []
        if stream is not None:
            if reason != "cancelled":
                tail, _ = stream.stops.feed(stream.utf8.flush())
                tail += stream.stops.flush()
                tail_logprobs = stream.logprobs if tail else []
            stream.sampler.close()
        park = None
        if seq.status.has_slot:
            # A speculating step may have left KV past what was accepted.
            self.ctx.seq_rm(seq.slot, seq.n_computed, -1)
            if self.prefix_cache is not None and self.scheduler.should_park(seq):
                # The slot keeps its KV for later requests that share a prefix.
                self.prefix_cache.on_finished(self.ctx, seq)
                park = seq.tokens[:seq.n_computed]
            else:
                self.ctx.seq_rm(seq.slot)
        now = self.scheduler.finish(seq, reason, park)
        first = seq.first_token_at or now
        seq.emit(FinishEvent(
            reason=seq.finish_reason or reason,
            usage=Usage(len(seq.prompt), len(seq.output), seq.n_cached),
            ttft_s=first - seq.arrived, duration_s=now - seq.arrived,
            decode_s=now - first, tail=tail, logprobs=tail_logprobs, stop=seq.stop_string))

    def _fail(self, seq: Sequence, error: BaseException) -> None:
        """End one request with an error event; never raises."""
        err = error if isinstance(error, LlmctlError) else \
            LlmctlError(f"generation failed: {type(error).__name__}: {error}")
        stream = self._streams.pop(seq.id, None)
        try:
            if stream is not None:
                stream.sampler.close()
            if seq.status.has_slot:
                self.ctx.seq_rm(seq.slot)
        except Exception:
            log.exception("cleaning up request %d", seq.id)
        self.scheduler.finish(seq, "error")
        seq.emit(ErrorEvent(err))

    def _end_all(self, end: Callable[[Sequence], None]) -> None:
        for seq in list(self.scheduler.running) + self.scheduler.take_all_waiting():
            try:
                end(seq)
            except Exception:
                log.exception("ending request %d", seq.id)


def _split(plan: list[Work]) -> tuple[list[Work], list[Work]] | None:
    """Two halves of a plan that is worth retrying smaller: by items, or a
    lone prompt chunk by tokens. None when it is one token already."""
    if len(plan) > 1:
        mid = len(plan) // 2
        return plan[:mid], plan[mid:]
    w = plan[0]
    if w.draft:         # retry without the guesses: a step of one token
        return [Work(w.seq, w.tokens[:1], w.pos, True)], []
    if len(w.tokens) < 2:
        return None
    mid = len(w.tokens) // 2
    return ([Work(w.seq, w.tokens[:mid], w.pos, False)],
            [Work(w.seq, w.tokens[mid:], w.pos + mid, w.sample)])
