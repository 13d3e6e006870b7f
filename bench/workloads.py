"""Workload shapes and the concurrency list: what to send, how many at once."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from llmctl.errors import UsageError

# Sizes after the Almanac's two canonical shapes.
PRESETS: dict[str, tuple[int, int]] = {
    "prefill-heavy": (1024, 128),   # RAG-like: long context, short answer
    "decode-heavy": (128, 1024),    # reasoning-like: short question, long answer
}
WORKLOADS = (*PRESETS, "custom")

# A prompt needs room for BOS and the per-request nonce that keeps it unique.
MIN_INPUT_TOKENS = 8
MAX_CONCURRENCY = 4096


@dataclass(frozen=True)
class Workload:
    name: str
    input_tokens: int
    output_tokens: int
    shared_prefix: int = 0
    scale: float = 1.0

    def to_dict(self) -> dict:
        return asdict(self)


def make_workload(workload: str | None, input_tokens: int | None,
                  output_tokens: int | None, scale: float = 1.0,
                  shared_prefix: int = 0) -> Workload:
    """Resolve the workload options into exact sizes, or a UsageError."""
    if workload is None:
        has_sizes = input_tokens is not None or output_tokens is not None
        workload = "custom" if has_sizes else "prefill-heavy"
    if workload not in WORKLOADS:
        raise UsageError(f"unknown workload {workload!r}; choose one of {', '.join(WORKLOADS)}")
    if not 0 < scale <= 1:
        raise UsageError(f"--scale must be in (0, 1], got {scale:g}")
    if workload == "custom":
        if input_tokens is None or output_tokens is None:
            raise UsageError("--workload custom needs both --input-tokens and --output-tokens")
        n_in, n_out = input_tokens, output_tokens
    else:
        if input_tokens is not None or output_tokens is not None:
            raise UsageError(f"--input-tokens/--output-tokens set the sizes of a custom "
                             f"workload; drop them or drop --workload {workload}")
        n_in, n_out = PRESETS[workload]
    n_in, n_out = round(n_in * scale), round(n_out * scale)
    if n_in < MIN_INPUT_TOKENS:
        raise UsageError(f"input tokens must be at least {MIN_INPUT_TOKENS}, got {n_in}")
    if n_out < 1:
        raise UsageError(f"output tokens must be at least 1, got {n_out}")
    if shared_prefix < 0 or shared_prefix > n_in - MIN_INPUT_TOKENS:
        raise UsageError(f"--shared-prefix must be between 0 and {n_in - MIN_INPUT_TOKENS} "
                         f"(input tokens minus {MIN_INPUT_TOKENS} for the unique part), "
                         f"got {shared_prefix}")
    return Workload(workload, n_in, n_out, shared_prefix, scale)


def parse_concurrency(text: str | None, requests: int) -> list[int]:
    """`1,4,16` -> [1, 4, 16]. Without a list, sweep powers of two from serial
    (1) up to maximum throughput (all `requests` at once)."""
    if requests < 1:
        raise UsageError(f"--requests must be at least 1, got {requests}")
    if text is None:
        levels, c = [], 1
        while c < requests:
            levels.append(c)
            c *= 2
        return levels + [requests]
    levels = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            raise UsageError(f"invalid --concurrency {text!r}: {part!r} is not an integer "
                             f"(expected a comma-separated list such as 1,4,16)") from None
        if not 1 <= value <= MAX_CONCURRENCY:
            raise UsageError(f"invalid --concurrency {text!r}: each level must be between "
                             f"1 and {MAX_CONCURRENCY}, got {value}")
        levels.append(value)
    return sorted(set(levels))


def burst_levels(burst: int, text: str | None, requests: int, sweep: bool) -> list[int]:
    """The levels of a `--burst N` run: N requests at once, the Almanac's
    throughput arm, after the --concurrency levels when given, or after
    powers of two from 1 (each with --requests requests) when `sweep` (an
    SLO to find the best level under)."""
    if not 1 <= burst <= MAX_CONCURRENCY:
        raise UsageError(f"--burst must be between 1 and {MAX_CONCURRENCY}, got {burst}")
    if text is not None:
        below = [c for c in parse_concurrency(text, requests) if c < burst]
    elif sweep:
        below = [c for c in parse_concurrency(None, burst) if c < burst]
    else:
        below = []
    return below + [burst]
