"""Whether this machine computes a row the same alone and in a batch.

ggml's CPU kernels compute a one-row step (a lone decode row) with another
kernel than a multi-row one (a prompt chunk, speculation's checked rows, or
several sequences decoding together), and on some CPUs the two round
differently (docs/exactness.md lists the machines measured). Where they
differ, a greedy answer can change at a near-tie (two tokens whose
log-probabilities are within rounding of each other) depending on the
company a request keeps or on whether its prompt was a prefix-cache hit.

So the guarantee is measured on the machine, never assumed:
`measure_rows` decodes the same rows one at a time, all together, and
beside another sequence's row, and compares the logits. `llmctl info`,
`scripts/bench_rows.py` and the test suite all read it (docs/exactness.md).
This module calls llama.cpp only through the package's classes."""

from __future__ import annotations

import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from llmctl.runtime.llama.context import ContextConfig, LlamaContext
from llmctl.runtime.llama.library import (
    LLAMA_CPP_VERSION,
    TILED_MATMUL_ENV,
    system_info,
)
from llmctl.runtime.llama.model import LlamaModel

# Any text works: the measurement needs real tokens, not meaning.
TEXT = "The quick brown fox jumps over the lazy dog while the hash table grows. " * 60
# Rows compared, and sequences in the step beside one: 9, because ggml's
# tiled K-quant matmul takes a call of 8 or more rows and rounds otherwise
# than the one-row kernel (docs/exactness.md), and speculation checks up to
# 8 guesses; 4 rows, as before, saw neither.
ROWS = 9
# Tokens before them. Few, so a measurement costs a fraction of a second:
# the one-row/multi-row difference is in the kernels, at any length (over
# 256 cells flash attention also splits a lone row's KV: scripts/bench_rows.py).
CONTEXT = 64

_cache: dict[tuple, "RowExactness"] = {}
_cache_lock = threading.Lock()


@dataclass(frozen=True)
class RowExactness:
    """One measurement: `exact` when every compared logit was bit-identical.
    `max_logit_diff` is the largest absolute difference seen (0.0 when
    exact), `rows_diff` and `seqs_diff` its two parts; `top_logprob_diff`
    bounds how far a gap between two likely tokens moved (by twice it)."""

    exact: bool
    max_logit_diff: float
    rows_diff: float        # ROWS rows of one sequence: one at a time vs in one batch
    seqs_diff: float        # one row alone vs the same row beside other sequences' rows
    top_logprob_diff: float  # among the 10 likeliest tokens: what moves a near-tie
    compared: str
    model: str
    flash_attn: bool
    repack: bool
    threads: int
    context: int

    def to_dict(self) -> dict:
        return asdict(self)

    def summary(self) -> str:
        """One line for people: the guarantee and the figure behind it."""
        if self.exact:
            return ("exact: a row computes the same alone and in a batch, so greedy answers do "
                    "not depend on batching or prefix-cache hits")
        return (f"not exact (max logit difference {self.max_logit_diff:.3g}): greedy answers "
                "agree up to the first near-tie, then may differ with batching or cache hits")


def compare_rows(ctx: LlamaContext, tokens: list[int], context: int = CONTEXT,
                 rows: int = ROWS) -> tuple[float, float, float]:
    """(rows_diff, seqs_diff, top_logprob_diff) on `ctx`, which must hold
    rows + 2 sequences of `context + rows` tokens: the largest logit
    differences between `rows` rows of one sequence decoded one at a time
    and together, and between a row decoded alone and the same row beside
    rows - 1 other sequences' (one decode step of `rows` sequences); and
    the largest log-probability difference among each row's 10 most likely
    tokens, which is what moves a near-tie. Clears ctx's KV. Raises
    ValueError for too few tokens or sequences, DecodeError from llama.cpp."""
    if len(tokens) < context + rows:
        raise ValueError(f"need {context + rows} tokens, got {len(tokens)}")
    if ctx.cfg.n_seq_max < rows + 2:
        raise ValueError(f"need {rows + 2} sequences, the context has {ctx.cfg.n_seq_max}")
    ctx.clear()
    head, tail = tokens[:context], tokens[context:context + rows]
    ctx.prefill(0, head)
    for seq in range(1, rows + 2):      # bit-identical KV in every sequence
        ctx.seq_cp(0, seq)
    alone = []
    for i in range(rows):
        row = ctx.decode([(0, [tail[i]], context + i, 1)])[0]
        alone.append(ctx.logits(row).copy())
    first = ctx.decode([(1, tail, context, rows)])[0]
    together = [ctx.logits(first + i).copy() for i in range(rows)]
    got = ctx.decode([(seq, [tail[0]], context, 1) for seq in range(2, rows + 2)])
    beside = [ctx.logits(r).copy() for r in got]
    ctx.clear()
    rows_diff = max(_diff(a, b) for a, b in zip(alone, together, strict=False))
    seqs_diff = max(_diff(alone[0], b) for b in beside)
    pairs = list(zip(alone, together, strict=False)) + [(alone[0], b) for b in beside]
    return rows_diff, seqs_diff, max(_top_logprob_diff(a, b) for a, b in pairs)


def _diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max())


def _top_logprob_diff(a: np.ndarray, b: np.ndarray, top: int = 10) -> float:
    la, lb = _log_softmax(a), _log_softmax(b)
    best = np.argsort(-la)[:top]
    return float(np.abs(la[best] - lb[best]).max())


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    peak = x.max()
    return x - peak - np.log(np.exp(x - peak).sum())


def build_key() -> tuple[str, str]:
    """What the kernels depend on besides the model: llama.cpp's version and
    the CPU features and flags it was built with and found."""
    return LLAMA_CPP_VERSION, system_info()


def measure_rows(path: str | Path, *, flash_attn: bool = False, repack: bool = False,
                 threads: int | None = None, context: int = CONTEXT) -> RowExactness:
    """Measure (once per process for each model file, build and setting)
    whether `path`'s logits are the same for a row alone and in a batch.
    `threads` defaults to the engine's. Loads the model for about a second.
    Raises BadModelFile, LlmctlError (no context) and DecodeError."""
    from llmctl.runtime.system import default_threads

    path = Path(path).resolve()
    threads = threads or default_threads()
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns, build_key(), flash_attn, repack, threads,
           context, os.environ.get(TILED_MATMUL_ENV))
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        result = _measure(path, flash_attn, repack, threads, context)
        _cache[key] = result
        return result


def _measure(path: Path, flash_attn: bool, repack: bool, threads: int,
             context: int) -> RowExactness:
    model = LlamaModel(path, repack=repack)
    try:
        ctx = LlamaContext(model, ContextConfig(n_ctx_seq=context + ROWS, n_seq_max=ROWS + 2,
                                                n_batch=max(512, context), n_threads=threads,
                                                flash_attn=flash_attn))
        tokens = model.tokenize(TEXT, add_special=False)
        rows_diff, seqs_diff, top_diff = compare_rows(ctx, tokens, context)
        ctx.close()
    finally:
        model.close()
    worst = max(rows_diff, seqs_diff)
    return RowExactness(
        exact=worst == 0.0, max_logit_diff=worst, rows_diff=rows_diff, seqs_diff=seqs_diff,
        top_logprob_diff=top_diff,
        compared=(f"logits of {ROWS} rows after {context} tokens, one at a time vs in one "
                  f"batch, and of one row alone vs beside {ROWS - 1} other sequences' rows"),
        model=path.name, flash_attn=flash_attn, repack=repack, threads=threads, context=context)

