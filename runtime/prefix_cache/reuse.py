"""Reuse past a prompt's first difference: runs of cached tokens that the
prompt repeats after a span that differs, moved to their new positions.

Coding agents put lines that change from run to run near the top of their
system prompt (the working directory, the date, git status), so a new
agent process shares only a short exact prefix with the last one, and
thousands of identical tokens follow. Their KV can be kept: llama.cpp
shifts a run of cells to new positions (llama_memory_seq_add re-rotates
the keys), and the differing span is computed in the gap at its own
positions. This is what llama-server's `--cache-reuse` does, extended to
spans that were replaced or inserted rather than only removed.

It is not exact: a moved run's KV was computed attending to the old span,
not the new one. How far answers agree with a cold prefill is measured
(docs/prefix-cache.md), and runs shorter than `min_run` tokens are never
moved, so a run is always one that matched token for token. Plain Python."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

ANCHOR = 8      # tokens that locate a run; a run then extends as far as it matches
# Tokens at a run's start computed afresh rather than moved. The tokens
# right after a changed span carry it in their KV (a copying model reads
# what followed a path to know where it ended), so an old one there can
# change an answer: measured, a working directory shortened to "/srv/x"
# was read back as "/srv/x26-12-07" (scripts/bench_changed_line.py).
SETTLE = 16


@dataclass(frozen=True)
class Run:
    """`n` tokens at `src` in the cached KV that the prompt has at `dst`."""

    src: int
    dst: int
    n: int


@dataclass(frozen=True)
class Reuse:
    """What a prompt reuses of one cached KV: `prefix` tokens in place, then
    `runs`, in order in both the cache and the prompt."""

    prefix: int
    runs: tuple[Run, ...] = ()

    @property
    def total(self) -> int:
        """Prompt tokens whose KV is reused."""
        return self.prefix + sum(r.n for r in self.runs)


def plan(have: list[int], prompt: list[int], prefix: int, min_run: int) -> Reuse:
    """The runs of `have` (the cached KV's tokens) that `prompt` repeats
    after its first `prefix` tokens, each at least `min_run` long, found
    left to right and never crossing each other. The prompt's last two
    tokens are never covered: the splice computes the one after the last
    run, and the engine the last, whose logits the first sample needs. A
    `min_run` of 0 turns moving off. Raises nothing."""
    end = len(prompt) - 2
    if min_run <= 0 or end - prefix < min_run or len(have) - prefix < min_run:
        return Reuse(prefix)
    k = min(ANCHOR, min_run)
    index: dict[tuple[int, ...], list[int]] = {}
    for i in range(prefix, len(have) - k + 1):
        index.setdefault(tuple(have[i:i + k]), []).append(i)
    runs: list[Run] = []
    p, c = prefix, prefix
    while p + min_run <= end:
        found = index.get(tuple(prompt[p:p + k]))
        at = bisect_left(found, c) if found else 0
        if not found or at == len(found):
            p += 1
            continue
        src = found[at]
        n = k
        while src + n < len(have) and p + n < end and have[src + n] == prompt[p + n]:
            n += 1
        if n < min_run:
            p += 1
            continue
        if n - SETTLE >= min_run:
            runs.append(Run(src + SETTLE, p + SETTLE, n - SETTLE))
        p, c = p + n, src + n
    return Reuse(prefix, tuple(runs))
