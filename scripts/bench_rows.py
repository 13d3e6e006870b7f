#!/usr/bin/env python3
"""What checking guessed tokens costs, and whether it is exact, measured
with the backend on one model (issue 14): the time of one llama_decode of
1, 2, 3, 5 and 9 rows after a 200-token prompt (a decode step, and a step
that checks 1-8 guesses), and the largest logit difference between rows
decoded one at a time and the same rows decoded together, with ggml's CPU
weight repacking on and off. Flash attention on, as speculation uses it.

    .venv/bin/python scripts/bench_rows.py [--model qwen2.5-coder-1.5b] [--threads 2]
        [--repeat 6] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from llmctl.runtime.backend import ContextConfig, LlamaContext, LlamaModel
from llmctl.store.resolve import resolve_model

TEXT = "The quick brown fox jumps over the lazy dog while the hash table grows. " * 60
ROWS = (1, 2, 3, 5, 9)


def measure(path, repack: bool, threads: int, repeat: int, n: int) -> dict:
    model = LlamaModel(path, repack=repack)
    ctx = LlamaContext(model, ContextConfig(n_ctx_seq=1024, n_seq_max=2, n_batch=512,
                                            n_threads=threads, flash_attn=True))
    try:
        toks = model.tokenize(TEXT, add_special=False)[:n + 20]
        ctx.decode([(0, toks[:n], 0, 0)])
        ctx.decode([(1, toks[:n], 0, 0)])
        ms = {}
        for rows in ROWS:
            times = []
            for _ in range(repeat):
                t = time.perf_counter()
                ctx.decode([(0, toks[n:n + rows], n, rows)])
                times.append(time.perf_counter() - t)
                ctx.seq_rm(0, n, -1)
            ms[rows] = 1e3 * statistics.median(times)
        # The same 4 rows one at a time (sequence 0) and together (sequence 1).
        alone = []
        for i in range(4):
            row = ctx.decode([(0, [toks[n + i]], n + i, 1)])[0]
            alone.append(ctx.logits(row).copy())
        first = ctx.decode([(1, toks[n:n + 4], n, 4)])[0]
        diff = max(float(np.abs(alone[i] - ctx.logits(first + i)).max()) for i in range(4))
        return {"ms": ms, "max_logit_diff": diff}
    finally:
        ctx.close()
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--context", type=int, default=200,
                    help="Tokens before the measured rows (over 256, flash attention splits a "
                         "lone decode row's KV across threads: not exact either way).")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = resolve_model(args.model).path
    result = {name: measure(path, repack, args.threads, args.repeat, args.context)
              for name, repack in (("repacked", True), ("plain layout", False))}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.model}, {args.threads} threads, {args.context} tokens before, medians of "
          f"{args.repeat}")
    for name, r in result.items():
        one = r["ms"][1]
        steps = ", ".join(f"{k} rows {v:.0f} ms ({v / one:.1f}x)" for k, v in r["ms"].items())
        print(f"{name:12}: {steps}; one-at-a-time vs together: max logit diff "
              f"{r['max_logit_diff']:.3g}")


if __name__ == "__main__":
    main()
