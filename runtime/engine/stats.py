"""The one source of serving statistics. The scheduler records every
finished request here; `/metrics`, `/stats` and chat's `/stats` all read the
same snapshot, so they can never disagree."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
OUTCOMES = ("ok", "error", "cancelled")


@dataclass
class Histogram:
    """Cumulative-style histogram: counts per bucket upper bound, plus +Inf."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def copy(self) -> "Histogram":
        return Histogram(self.buckets, list(self.counts), self.total, self.n)


@dataclass(frozen=True)
class Stats:
    """A consistent snapshot of one engine's counters and gauges."""

    running: int
    waiting: int
    parked_slots: int
    free_slots: int
    requests: dict[str, int]            # outcome -> count ("ok", "error", "cancelled")
    prompt_tokens: int
    cached_tokens: int                  # prompt tokens not recomputed (memory + disk hits)
    cached_tokens_disk: int
    generation_tokens: int
    ttft: Histogram
    itl: Histogram
    spec_steps: int = 0                 # decode steps that checked guessed tokens
    spec_drafted: int = 0               # guessed tokens checked
    spec_accepted: int = 0              # ...that were right
    spec_declined: int = 0              # guesses --spec auto found not worth a check
    spec_saved_s: float = 0.0           # decode time speculation saved, as measured
    embed_requests: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))
    embed_tokens: int = 0               # tokens computed for embeddings
    step_age_s: float = 0.0             # gauge: since the engine's last step, while it has work

    def idle(self) -> "Stats":
        """This snapshot's counters with its gauges at zero (an unloaded model)."""
        return Stats(0, 0, 0, 0, dict(self.requests), self.prompt_tokens, self.cached_tokens,
                     self.cached_tokens_disk, self.generation_tokens, self.ttft, self.itl,
                     self.spec_steps, self.spec_drafted, self.spec_accepted,
                     self.spec_declined, self.spec_saved_s,
                     dict(self.embed_requests), self.embed_tokens)

    @property
    def spec_acceptance(self) -> float:
        """Share of guessed tokens that were right (0 without speculation)."""
        return self.spec_accepted / self.spec_drafted if self.spec_drafted else 0.0

    @property
    def spec_mean_accepted(self) -> float:
        """Guessed tokens kept per speculating step."""
        return self.spec_accepted / self.spec_steps if self.spec_steps else 0.0

    @property
    def cached_tokens_memory(self) -> int:
        return self.cached_tokens - self.cached_tokens_disk

    def as_dict(self) -> dict:
        return {"requests": dict(self.requests), "requests_running": self.running,
                "requests_waiting": self.waiting, "slots_parked": self.parked_slots,
                "slots_free": self.free_slots, "prompt_tokens": self.prompt_tokens,
                "prefix_cache_hit_tokens": self.cached_tokens,
                "prefix_cache_hit_tokens_memory": self.cached_tokens_memory,
                "prefix_cache_hit_tokens_disk": self.cached_tokens_disk,
                "generation_tokens": self.generation_tokens,
                "spec_steps": self.spec_steps,
                "spec_drafted_tokens": self.spec_drafted,
                "spec_accepted_tokens": self.spec_accepted,
                "spec_acceptance_rate": round(self.spec_acceptance, 4),
                "spec_mean_accepted_length": round(self.spec_mean_accepted, 3),
                "spec_declined_guesses": self.spec_declined,
                "spec_saved_s": round(self.spec_saved_s, 3),
                "embedding_requests": dict(self.embed_requests),
                "embedding_tokens": self.embed_tokens,
                "engine_step_age_s": round(self.step_age_s, 3)}


class StatsCollector:
    """Thread-safe counters the scheduler feeds as requests finish."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = dict.fromkeys(OUTCOMES, 0)
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.cached_tokens_disk = 0
        self.generation_tokens = 0
        self.spec_steps = self.spec_drafted = self.spec_accepted = self.spec_declined = 0
        self.spec_saved_s = 0.0
        self.embed_requests = dict.fromkeys(OUTCOMES, 0)
        self.embed_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def record(self, outcome: str, prompt: int, cached: int, cached_disk: int, generated: int,
               ttft_s: float | None, decode_s: float) -> None:
        """Count one finished request; `ttft_s` is None when no token came."""
        with self._lock:
            self.requests[outcome] = self.requests.get(outcome, 0) + 1
            self.prompt_tokens += prompt
            self.cached_tokens += cached
            self.cached_tokens_disk += cached_disk
            self.generation_tokens += generated
            if ttft_s is not None and generated:
                self.ttft.observe(ttft_s)
            if generated > 1:
                # One mean gap per request keeps the histogram cheap and is
                # what clients perceive as the stream's pace.
                self.itl.observe(decode_s / (generated - 1))

    def record_spec(self, drafted: int, accepted: int) -> None:
        """Count one speculating step: `drafted` guesses, `accepted` right."""
        with self._lock:
            self.spec_steps += 1
            self.spec_drafted += drafted
            self.spec_accepted += accepted

    def record_spec_declined(self, n: int) -> None:
        """Count `n` proposals that --spec auto did not check."""
        with self._lock:
            self.spec_declined += n

    def record_spec_saved(self, seconds: float) -> None:
        """Add what a speculating step saved (negative: what it cost)."""
        with self._lock:
            self.spec_saved_s += seconds

    def record_embed_tokens(self, n: int) -> None:
        """Count `n` tokens computed for embeddings (one batch's)."""
        with self._lock:
            self.embed_tokens += n

    def record_embed_request(self, outcome: str) -> None:
        """Count one finished embeddings request: "ok", "error" or "cancelled"."""
        with self._lock:
            self.embed_requests[outcome] = self.embed_requests.get(outcome, 0) + 1

    def snapshot(self, running: int, waiting: int, parked: int, free: int) -> Stats:
        with self._lock:
            return Stats(running, waiting, parked, free, dict(self.requests), self.prompt_tokens,
                         self.cached_tokens, self.cached_tokens_disk, self.generation_tokens,
                         self.ttft.copy(), self.itl.copy(), self.spec_steps, self.spec_drafted,
                         self.spec_accepted, self.spec_declined, self.spec_saved_s,
                         dict(self.embed_requests), self.embed_tokens)


def _merged(hists: list[Histogram], buckets: tuple[float, ...]) -> Histogram:
    out = Histogram(buckets)
    for h in hists:
        out.counts = [a + b for a, b in zip(out.counts, h.counts, strict=False)]
        out.total += h.total
        out.n += h.n
    return out


def combine(snapshots: list[Stats]) -> Stats:
    """One snapshot adding up several engines' (a server's models, and
    those it has unloaded: counters must never go down)."""
    requests = dict.fromkeys(OUTCOMES, 0)
    embed_requests = dict.fromkeys(OUTCOMES, 0)
    for s in snapshots:
        for k, v in s.requests.items():
            requests[k] = requests.get(k, 0) + v
        for k, v in s.embed_requests.items():
            embed_requests[k] = embed_requests.get(k, 0) + v

    def total(attr: str):
        return sum(getattr(s, attr) for s in snapshots)

    return Stats(total("running"), total("waiting"), total("parked_slots"), total("free_slots"),
                 requests, total("prompt_tokens"), total("cached_tokens"),
                 total("cached_tokens_disk"), total("generation_tokens"),
                 _merged([s.ttft for s in snapshots], TTFT_BUCKETS),
                 _merged([s.itl for s in snapshots], ITL_BUCKETS), total("spec_steps"),
                 total("spec_drafted"), total("spec_accepted"), total("spec_declined"),
                 total("spec_saved_s"), embed_requests,
                 total("embed_tokens"), max((s.step_age_s for s in snapshots), default=0.0))
