"""The continuous-batching engine: one thread, one llama_context, many
sequences. Requests join the running batch at the next step; every step is
a single llama_decode over all decoding streams plus prompt chunks.

ctypes releases the GIL inside llama_decode, so callers (the HTTP event
loop, the chat REPL) stay responsive while the engine computes."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from llmctl.errors import ContextOverflow, DecodeError, InvalidParams, LlmctlError, QueueFull
from llmctl.runtime.backend import ContextConfig, LlamaContext, LlamaModel, Sampler
from llmctl.runtime.detok import StopMatcher, Utf8Stream
from llmctl.runtime.events import EngineStats, ErrorEvent, FinishEvent, TokenEvent, Usage
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.scheduler import Scheduler, SchedulerConfig, Work
from llmctl.runtime.sequence import Sequence


@dataclass(frozen=True)
class EngineConfig:
    n_ctx_seq: int = 4096
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_queue: int = 256
    n_threads: int = 2
    flash_attn: bool | None = None      # None: on unless the prefix cache is on


class _Stream:
    """Per-sequence decoding state that lives beside the Sequence."""

    def __init__(self, model: LlamaModel, seq: Sequence):
        seed = seq.params.seed if seq.params.seed is not None else random.getrandbits(32)
        self.sampler = Sampler(model, seq.params, seed)
        self.utf8 = Utf8Stream()
        self.stops = StopMatcher(seq.params.stop)


class Engine:
    def __init__(self, model: LlamaModel, cfg: EngineConfig, prefix_cache: Any = None):
        self.model = model
        self.cfg = cfg
        self.ctx = LlamaContext(model, ContextConfig(
            n_ctx_seq=cfg.n_ctx_seq, n_seq_max=cfg.max_num_seqs,
            n_batch=cfg.max_num_batched_tokens, n_threads=cfg.n_threads,
            flash_attn=self._flash_attn(cfg, prefix_cache)))
        self.n_ctx_seq = self.ctx.n_ctx_seq
        self.scheduler = Scheduler(SchedulerConfig(
            cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_queue,
            prefix_sharing=prefix_cache is not None))
        self.prefix_cache = prefix_cache
        self.stats = EngineStats()
        self._streams: dict[int, _Stream] = {}
        self._inbox: list[Sequence] = []
        self._cv = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="llmctl-engine", daemon=True)
        self._thread.start()

    @staticmethod
    def _flash_attn(cfg: EngineConfig, prefix_cache: Any) -> bool:
        # CPU flash attention picks its kernel by how many query rows a chunk
        # has, so a token's logits depend on how its prompt was split; a
        # prefix hit could then change greedy output. Off by default with
        # the cache (bit-exact hits); on is faster but hits may differ.
        return cfg.flash_attn if cfg.flash_attn is not None else prefix_cache is None

    # ---- called from any thread -------------------------------------------------

    def submit(self, prompt: list[int], params: SamplingParams,
               emit: Callable[[Any], None]) -> Sequence:
        """Queue a request. Raises (before anything streams) when it can never
        run: an empty or too-long prompt, or a full queue."""
        if not prompt:
            raise InvalidParams("the prompt is empty", param="prompt")
        want = params.max_tokens or 1
        if len(prompt) + want > self.n_ctx_seq:
            raise ContextOverflow(
                f"prompt ({len(prompt)} tokens) plus max_tokens ({want}) exceeds the "
                f"context of {self.n_ctx_seq} tokens", param="max_tokens")
        max_new = params.max_tokens or (self.n_ctx_seq - len(prompt))
        seq = Sequence(prompt=prompt, params=params, max_new=max_new, emit=emit)
        with self._cv:
            # Requests that will find a free slot at the next step are not queued.
            queued = len(self._inbox) + len(self.scheduler.waiting) - len(self.scheduler.free_slots)
            if queued >= self.cfg.max_queue:
                raise QueueFull("server busy: the request queue is full, retry shortly")
            self._inbox.append(seq)
            self._cv.notify()
        return seq

    def cancel(self, seq: Sequence) -> None:
        seq.cancelled = True
        with self._cv:
            self._cv.notify()

    @property
    def n_waiting(self) -> int:
        return len(self.scheduler.waiting) + len(self._inbox)

    @property
    def n_running(self) -> int:
        return len(self.scheduler.running)

    def close(self) -> None:
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join(timeout=30)
        for seq in list(self.scheduler.running) + list(self.scheduler.waiting):
            self._finish(seq, "cancelled")
        if self.prefix_cache is not None:
            self.prefix_cache.close()
        self.ctx.close()

    # ---- the engine thread ------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cv:
                while not (self._inbox or self.scheduler.has_work() or self._stopping):
                    self._cv.wait()
                if self._stopping:
                    return
                for seq in self._inbox:
                    self.scheduler.waiting.append(seq)
                self._inbox.clear()
            try:
                self._step()
            except Exception as e:  # never let one bad step kill the server
                self._fail_all(e)

    def _step(self) -> None:
        for seq in [s for s in self.scheduler.running + list(self.scheduler.waiting) if s.cancelled]:
            self._finish(seq, "cancelled")
        self._admit()
        plan = self.scheduler.schedule()
        if not plan:
            return
        try:
            rows = self.ctx.decode([(w.seq.slot, w.tokens, w.pos, w.sample) for w in plan])
        except DecodeError as e:
            for w in plan:
                self._fail(w.seq, e)
            return
        for w, row in zip(plan, rows):
            self._advance(w, row)

    def _admit(self) -> None:
        admitted = self.scheduler.admit()
        for seq in admitted:
            self._streams[seq.id] = _Stream(self.model, seq)
        if self.prefix_cache is not None:
            # Waiters get their KV once their leader has computed the prefix.
            ready = [s for s in admitted if s.wait_for is None]
            self.prefix_cache.attach(self.ctx, ready + self.scheduler.release_waiters())

    def _advance(self, w: Work, row: int) -> None:
        seq = w.seq
        seq.n_computed += len(w.tokens)
        if not w.sample or seq.cancelled:
            return
        if self.prefix_cache is not None and len(seq.output) == 0:
            self.prefix_cache.on_prefilled(self.ctx, seq)
        token = self._streams[seq.id].sampler.sample(self.ctx, row)
        self._accept(seq, token)

    def _accept(self, seq: Sequence, token: int) -> None:
        stream = self._streams[seq.id]
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        seq.output.append(token)
        is_eog = self.model.is_eog(token)
        reason = Scheduler.stop_reason(seq, token, is_eog, self.n_ctx_seq)
        if not (is_eog and reason == "stop"):
            text, hit = stream.stops.feed(stream.utf8.feed(self.model.piece(token)))
            if text:
                seq.emit(TokenEvent(text, token))
            if hit:
                seq.finish_reason = "stop"
                reason = "stop"
                stream.stops = StopMatcher(())   # drop held text: it was the stop
        if reason:
            self._finish(seq, reason)

    def _finish(self, seq: Sequence, reason: str) -> None:
        stream = self._streams.pop(seq.id, None)
        tail = ""
        if stream is not None:
            if reason != "cancelled":
                tail, _ = stream.stops.feed(stream.utf8.flush())
                tail += stream.stops.flush()
            stream.sampler.close()
        park = None
        if seq.slot >= 0 and seq in self.scheduler.running:
            if self.prefix_cache is not None and self.scheduler.should_park(seq):
                # The slot keeps its KV for later requests that share a prefix.
                self.prefix_cache.on_finished(self.ctx, seq)
                park = seq.tokens[:seq.n_computed]
            else:
                self.ctx.seq_rm(seq.slot)
        self.scheduler.finish(seq, reason, park)
        seq.finished_at = now = time.perf_counter()
        self._count(seq)
        first = seq.first_token_at or now
        seq.emit(FinishEvent(
            reason=seq.finish_reason or reason,
            usage=Usage(len(seq.prompt), len(seq.output), seq.n_cached),
            ttft_s=first - seq.arrived, duration_s=now - seq.arrived,
            decode_s=now - first, tail=tail))

    def _count(self, seq: Sequence) -> None:
        s = self.stats
        s.requests_total += 1
        s.prompt_tokens_total += len(seq.prompt)
        s.cached_tokens_total += seq.n_cached
        s.generation_tokens_total += len(seq.output)

    def _fail(self, seq: Sequence, error: Exception) -> None:
        err = error if isinstance(error, LlmctlError) else LlmctlError(f"{type(error).__name__}: {error}")
        self._streams.pop(seq.id, None)
        if seq in self.scheduler.running:
            self.ctx.seq_rm(seq.slot)
        self.scheduler.finish(seq, "error")
        seq.emit(ErrorEvent(err))

    def _fail_all(self, error: Exception) -> None:
        for seq in list(self.scheduler.running):
            self._fail(seq, error)
