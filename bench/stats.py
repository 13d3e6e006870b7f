"""Per-level statistics: throughput, latency percentiles, errors."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from llmctl.bench.client import RequestResult


def percentile(values: list[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (numpy's default), so small
    samples still give a p99 that moves with the data."""
    if not values:
        return None
    data = sorted(values)
    pos = (len(data) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def summarize(values: list[float], qs: tuple[int, ...] = (50, 95, 99)) -> dict:
    out = {f"p{q}": percentile(values, q) for q in qs}
    out["mean"] = sum(values) / len(values) if values else None
    return out


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


@dataclass
class LevelStats:
    concurrency: int
    requests: int
    ok: int
    errors: int
    duration_s: float
    requests_per_s: float
    output_tokens_per_s: float
    ttft: dict
    itl: dict
    e2e: dict
    mean_prompt_tokens: float | None
    mean_output_tokens: float | None
    error_messages: dict = field(default_factory=dict)
    results: list[dict] = field(default_factory=list)


def level_stats(concurrency: int, results: list[RequestResult], duration: float) -> LevelStats:
    """Throughput counts only successful requests: N / time until all finish,
    as the Almanac defines it, minus the ones that failed."""
    good = [r for r in results if r.ok]
    out_tokens = sum(r.completion_tokens or 0 for r in good)
    duration = max(duration, 1e-9)
    return LevelStats(
        concurrency=concurrency,
        requests=len(results),
        ok=len(good),
        errors=len(results) - len(good),
        duration_s=duration,
        requests_per_s=len(good) / duration,
        output_tokens_per_s=out_tokens / duration,
        # A request is ok only once its first token came (ttft) and it ended (e2e).
        ttft=summarize([r.ttft for r in good if r.ttft is not None]),
        itl=summarize([gap for r in good for gap in r.itl]),
        e2e=summarize([r.e2e for r in good if r.e2e is not None]),
        mean_prompt_tokens=_mean([r.prompt_tokens for r in good]),
        mean_output_tokens=_mean([r.completion_tokens for r in good]),
        error_messages=dict(Counter(r.error for r in results if r.error).most_common()),
        results=[r.to_dict() for r in results],
    )


def best_under_slo(levels: list[dict], slo_ttft: float) -> dict | None:
    """The level with the highest throughput whose p95 TTFT meets the
    objective. A level with errors does not qualify: failing requests
    would otherwise buy it a better latency."""
    passing = [lv for lv in levels
               if lv["ok"] and not lv["errors"] and lv["ttft"]["p95"] <= slo_ttft]
    return max(passing, key=lambda lv: lv["requests_per_s"], default=None)
