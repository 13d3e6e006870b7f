"""Prometheus text exposition for /metrics, without a client library: a few
counters and two histograms don't justify another dependency. The numbers
come from the engine's one Stats snapshot (runtime/stats.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from llmctl.runtime.engine.stats import Histogram, Stats

if TYPE_CHECKING:
    from llmctl.server.admission import QueueView

_P = "llmctl"


def _histogram(name: str, h: Histogram) -> list[str]:
    lines, cumulative = [f"# TYPE {name} histogram"], 0
    for bound, count in zip(h.buckets, h.counts, strict=False):
        cumulative += count
        lines.append(f'{name}_bucket{{le="{bound}"}} {cumulative}')
    lines.append(f'{name}_bucket{{le="+Inf"}} {h.n}')
    lines.append(f"{name}_sum {h.total:.6f}")
    lines.append(f"{name}_count {h.n}")
    return lines


def _gauge(name: str, value: int | str, kind: str = "gauge") -> list[str]:
    return [f"# TYPE {_P}_{name} {kind}", f"{_P}_{name} {value}"]


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _per_model(per_model: dict[str, Stats]) -> list[str]:
    """Speculation's counters by model: whether it pays depends on the model."""
    series = (("spec_steps_total", "spec_steps"), ("spec_accepted_tokens_total", "spec_accepted"),
              ("spec_declined_tokens_total", "spec_declined"),
              ("spec_saved_seconds_total", "spec_saved_s"))
    lines = []
    for name, attr in series:
        lines.append(f"# TYPE {_P}_model_{name} counter")
        for model, s in per_model.items():
            label = model.replace("\\", "\\\\").replace('"', '\\"')
            lines.append(f'{_P}_model_{name}{{model="{label}"}} {getattr(s, attr):g}')
    return lines


def render(stats: Stats, models_loaded: int, per_model: dict[str, Stats] | None = None) -> str:
    """The exposition text of one snapshot (every model's, added up), and
    of each loaded model's speculation counters."""
    lines = [
        *_gauge("models_loaded", models_loaded),
        *_gauge("requests_running", stats.running),
        *_gauge("requests_waiting", stats.waiting),
        *_gauge("slots_parked", stats.parked_slots),
        f"# TYPE {_P}_requests_total counter",
        *(f'{_P}_requests_total{{status="{k}"}} {v}' for k, v in stats.requests.items()),
        *_gauge("prompt_tokens_total", stats.prompt_tokens, "counter"),
        *_gauge("prefix_cache_hit_tokens_total", stats.cached_tokens, "counter"),
        *_gauge("prefix_cache_disk_hit_tokens_total", stats.cached_tokens_disk, "counter"),
        *_gauge("generation_tokens_total", stats.generation_tokens, "counter"),
        *_gauge("spec_drafted_tokens_total", stats.spec_drafted, "counter"),
        *_gauge("spec_accepted_tokens_total", stats.spec_accepted, "counter"),
        *_gauge("spec_steps_total", stats.spec_steps, "counter"),
        *_gauge("spec_declined_tokens_total", stats.spec_declined, "counter"),
        *_gauge("spec_saved_seconds_total", f"{stats.spec_saved_s:.3f}", "counter"),
        f"# TYPE {_P}_embedding_requests_total counter",
        *(f'{_P}_embedding_requests_total{{status="{k}"}} {v}'
          for k, v in stats.embed_requests.items()),
        *_gauge("embedding_tokens_total", stats.embed_tokens, "counter"),
        # A stuck step shows here before /health's stall window calls it one.
        *_gauge("engine_step_age_seconds", f"{stats.step_age_s:.3f}"),
        *_histogram(f"{_P}_time_to_first_token_seconds", stats.ttft),
        *_histogram(f"{_P}_inter_token_latency_seconds", stats.itl),
        *_per_model(per_model or {}),
    ]
    return "\n".join(lines) + "\n"


def render_queue(view: QueueView) -> str:
    """The server's queue (admission.py): what waits, how long the oldest
    has waited, the memory it holds, and what was refused."""
    lines = [
        *_gauge("queue_requests", view.queued),
        *_gauge("queue_bytes", view.queued_bytes),
        *_gauge("queue_oldest_wait_seconds", f"{view.oldest_wait_s:.3f}"),
        *_gauge("queue_limit_requests", view.max_queued),
        *_gauge("queue_limit_bytes", view.max_queued_bytes),
        *_gauge("requests_in_flight", view.in_flight),
        *_gauge("queue_refused_total", view.refused, "counter"),
        f"# TYPE {_P}_queue_protocol_requests gauge",
        *(f'{_P}_queue_protocol_requests{{protocol="{p}"}} {n}'
          for p, n in sorted(view.by_protocol.items())),
        f"# TYPE {_P}_queue_model_requests gauge",
        *(f'{_P}_queue_model_requests{{model="{_label(m)}"}} {n}'
          for m, n in sorted(view.by_model.items())),
    ]
    return "\n".join(lines) + "\n"
