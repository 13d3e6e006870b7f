"""Prometheus text exposition for /metrics, without a client library: a few
counters and two histograms don't justify another dependency."""

from __future__ import annotations

import bisect
import threading
from dataclasses import dataclass, field

TTFT_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Histogram:
    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def render(self, name: str) -> list[str]:
        lines, cumulative = [], 0
        for bound, count in zip(self.buckets, self.counts):
            cumulative += count
            lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
        lines.append(f'{name}_bucket{{le="+Inf"}} {self.n}')
        lines.append(f"{name}_sum {self.total:.6f}")
        lines.append(f"{name}_count {self.n}")
        return lines


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests = {"ok": 0, "error": 0, "cancelled": 0}
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.generation_tokens = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)

    def finished(self, status: str, prompt: int, cached: int, generated: int,
                 ttft: float | None, decode_s: float) -> None:
        with self._lock:
            self.requests[status] = self.requests.get(status, 0) + 1
            self.prompt_tokens += prompt
            self.cached_tokens += cached
            self.generation_tokens += generated
            if ttft is not None and generated:
                self.ttft.observe(ttft)
            if generated > 1:
                # One mean gap per request keeps the histogram cheap and
                # is what clients perceive as the stream's pace.
                self.itl.observe(decode_s / (generated - 1))

    def render(self, running: int, waiting: int) -> str:
        p = "llmctl"
        with self._lock:
            lines = [
                f"# TYPE {p}_requests_running gauge", f"{p}_requests_running {running}",
                f"# TYPE {p}_requests_waiting gauge", f"{p}_requests_waiting {waiting}",
                f"# TYPE {p}_requests_total counter",
                *(f'{p}_requests_total{{status="{k}"}} {v}' for k, v in self.requests.items()),
                f"# TYPE {p}_prompt_tokens_total counter", f"{p}_prompt_tokens_total {self.prompt_tokens}",
                f"# TYPE {p}_prefix_cache_hit_tokens_total counter",
                f"{p}_prefix_cache_hit_tokens_total {self.cached_tokens}",
                f"# TYPE {p}_generation_tokens_total counter",
                f"{p}_generation_tokens_total {self.generation_tokens}",
                f"# TYPE {p}_time_to_first_token_seconds histogram",
                *self.ttft.render(f"{p}_time_to_first_token_seconds"),
                f"# TYPE {p}_inter_token_latency_seconds histogram",
                *self.itl.render(f"{p}_inter_token_latency_seconds"),
            ]
        return "\n".join(lines) + "\n"
