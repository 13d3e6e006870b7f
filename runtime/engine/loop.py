"""The continuous-batching engine: one thread, one llama_context, many
sequences. Requests join the running batch at the next step; every step is
a single llama_decode over all decoding sequences plus prompt chunks.

A step is plan, run, result, update (docs/architecture.md): the scheduler
plans it (a StepPlan: KV to attach, rows to decode), speculation fills in
its guesses, the runner carries it out with llama.cpp (a StepResult), and
the scheduler's update applies the result, the only place a running
sequence's state changes. This file drives that loop, has the KV manager
carry out what the update asks (a prompt's state saved, a slot kept,
parked or cleared) and sends each request its events.

Failures stay with the sequence that caused them: a sampling or
detokenizing error fails that request only."""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import TYPE_CHECKING, Callable

from llmctl.errors import ContextOverflow, EngineFailed, InvalidParams
from llmctl.runtime.engine.events import ErrorEvent, Event
from llmctl.runtime.engine.kv import KvManager
from llmctl.runtime.engine.plan import Ending, StepOutput
from llmctl.runtime.engine.runner import Runner
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence
from llmctl.runtime.engine.speculate import Speculation
from llmctl.runtime.engine.stats import Stats
from llmctl.runtime.llama import LlamaContext, LlamaModel, validate_sampling
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.proposer import Proposer

if TYPE_CHECKING:
    from llmctl.runtime.llama import Splicer
    from llmctl.runtime.prefix_cache.cache import PrefixCache

log = logging.getLogger("llmctl.engine")


class Engine:
    """Runs requests on one model in `ctx`, its context made for `opts`
    (build.py makes the parts), which the engine owns and closes, with
    `prefix_cache` and `proposer` as they too. Raises EngineFailed from
    `submit` once its thread has died; `alive` and `failure` say so to
    health checks, and `stalled` says when it has work and makes no step.

    `opts.settings` says how long a step may take before the engine counts
    as stalled (engine_stall_s) and bounds each request's grammar work."""

    def __init__(self, model: LlamaModel, ctx: LlamaContext, opts: LoadOptions, *,
                 prefix_cache: PrefixCache | None = None, proposer: Proposer | None = None,
                 splicer: Splicer | None = None):
        self.model = model
        self.stall_s = opts.settings.engine_stall_s
        # When the engine last finished a step, or last got work while idle.
        self._progress_at = time.monotonic()
        self.flash_attn = opts.use_flash_attn
        self.ctx = ctx
        self.n_ctx_seq = ctx.n_ctx_seq
        self.max_num_seqs = opts.max_num_seqs
        self.prefix_cache = prefix_cache
        self.kv = KvManager(ctx, prefix_cache.disk if prefix_cache else None, splicer)
        self.runner = Runner(model, ctx, self.kv, GrammarBudget.of(opts.settings),
                             bool(opts.backend_sampling))
        # Deterministic flash attention cuts prompts by its tile so that
        # prefix hits stay bit-exact (prefix_cache/rule.py); else any cut.
        self.scheduler = Scheduler(SchedulerConfig(
            opts.max_num_seqs, opts.step_tokens, opts.max_queue,
            prefix_sharing=prefix_cache is not None, tile=opts.prompt_tile,
            # Runs move only where the prefix cache has a splicer for them.
            min_run=prefix_cache.min_run if prefix_cache else 0,
            spec=opts.spec_config, n_ctx_seq=self.n_ctx_seq),
            cache=prefix_cache, splicing=splicer is not None)
        self.spec = None if proposer is None else Speculation(
            proposer, opts.spec_config.mode == "auto", self.scheduler.collector)
        self.failure: str | None = None
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
        self._end_all("cancelled")
        self.runner.close_all()
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        self.kv.close()
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
            self._end_all("error", e)

    def _step(self) -> None:
        for seq in self.scheduler.take_cancelled():
            self._end(seq, "cancelled")
        for seq in self.scheduler.admit():
            try:
                self.scheduler.opened(seq, self.runner.open(seq))
            except Exception as e:      # a grammar llama.cpp refuses: this request alone
                log.warning("request %d failed: %s: %s", seq.id, type(e).__name__, e)
                self._end(seq, "error", e)
        plan = self.scheduler.schedule()
        if not plan:
            return
        if self.spec is not None:
            plan = self.spec.fill(plan)
        # Speculation learns what a step costs from the whole of it, its
        # events sent and KV settled included, as the controller was tuned.
        start = time.perf_counter()
        result = self.runner.run(plan)
        self._deliver(self.scheduler.update(plan, result))
        if self.spec is not None:
            self.spec.learn(plan, result, time.perf_counter() - start)

    def _end(self, seq: Sequence, reason: str, error: BaseException | None = None) -> None:
        """End one request outside a step's update (cancelled, failed)."""
        ending = self.scheduler.end(seq, reason, error)
        self._deliver(StepOutput([(seq, ending.event)], [], [ending]))

    def _deliver(self, out: StepOutput) -> None:
        """What an update asks: prompts' states saved to the disk store,
        ended sequences' KV kept to what they computed, then parked (its
        state saved when the reply added a block) or cleared, their
        sampler chains freed; then every event sent, in order."""
        cache = self.prefix_cache
        for seq in out.prefilled:
            save = cache.prefilled_state(seq.prompt, seq.n_cached) if cache else None
            if save is not None and seq.slot >= 0:
                self.kv.save(seq.slot, save)
        for e in out.ended:
            try:
                self._release(e)
            except Exception:
                log.exception("ending request %d", e.seq.id)
        for seq, event in out.events:
            seq.emit(event)

    def _release(self, e: Ending) -> None:
        self.runner.close(e.seq)
        if self.spec is not None:
            self.spec.forget(e.seq.id)
        if e.slot is None:
            return
        if isinstance(e.event, ErrorEvent) or e.park is None:
            self.kv.clear(e.slot)
            return
        # A speculating step may have left KV past what was accepted.
        self.kv.keep(e.slot, len(e.park))
        save = self.prefix_cache.finished_state(e.park, len(e.seq.prompt)) \
            if self.prefix_cache else None
        if save is not None:
            self.kv.save(e.slot, save)

    def _end_all(self, reason: str, error: BaseException | None = None) -> None:
        for seq in list(self.scheduler.running) + self.scheduler.take_all_waiting():
            try:
                self._end(seq, reason, error)
            except Exception:
                log.exception("ending request %d", seq.id)
