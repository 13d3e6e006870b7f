#!/usr/bin/env python3
"""What checking guessed tokens costs, and whether it is exact, measured
with the backend on one model: the time of one llama_decode of
1, 2, 3, 5 and 9 rows after a 200-token prompt (a decode step, and a step
that checks 1-8 guesses), and the largest logit difference between rows
decoded one at a time and the same rows decoded together (and between a
row alone and beside another sequence's row), with ggml's CPU weight
repacking on (--repack), and off (serve's default) with ggml's tiled K-quant
matmul on and off. Flash attention on by default, as speculation uses
it; `--flash-attn off` measures what a prefix-cache hit and a batched
request depend on under the server's default settings (docs/exactness.md).
The exactness figure is llmctl.runtime.llama.exactness's, the one `llmctl info`
and the test suite read.

    .venv/bin/python scripts/bench_rows.py [--model qwen2.5-coder-1.5b] [--threads 2]
        [--repeat 6] [--flash-attn on|off] [--rows 1,2,3,5,9] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.llama.exactness import ROWS as CHECKED
from llmctl.runtime.llama.exactness import TEXT, compare_rows
from llmctl.runtime.llama.library import TILED_MATMUL_ENV
from llmctl.store.resolve import resolve_model

ROWS = (1, 2, 3, 5, 9)


def _time(repeat: int, step, undo) -> float:
    """Median ms of `step()`, with `undo()` after each."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
        undo()
    return 1e3 * statistics.median(times)


def measure(path, repack: bool, threads: int, repeat: int, n: int, flash_attn: bool,
            rows_list=ROWS, seqs: int = 0) -> dict:
    model = LlamaModel(path, repack=repack)
    need = n + max(20, *rows_list)
    ctx = LlamaContext(model, ContextConfig(n_ctx_seq=max(1024, need + 32),
                                            n_seq_max=max(CHECKED + 2, seqs), n_batch=512,
                                            n_threads=threads, flash_attn=flash_attn))
    try:
        toks = model.tokenize(TEXT, add_special=False)
        while len(toks) < need:                         # long batches need more text
            toks += toks
        toks = toks[:need]
        ctx.prefill(0, toks[:n])
        ms = {rows: _time(repeat, lambda rows=rows: ctx.decode([(0, toks[n:n + rows], n, rows)]),
                          lambda: ctx.seq_rm(0, n, -1))
              for rows in rows_list}
        seq_ms = None
        if seqs:        # a decode step of `seqs` sequences, one row each, as a full batch runs
            for s in range(1, seqs):
                ctx.seq_cp(0, s)
            seq_ms = _time(repeat, lambda: ctx.decode([(s, toks[n:n + 1], n, 1)
                                                       for s in range(seqs)]),
                           lambda: [ctx.seq_rm(s, n, -1) for s in range(seqs)])
        rows_diff, seqs_diff, top_diff = compare_rows(ctx, toks, n)
        return {"ms": ms, "seqs_ms": seq_ms, "max_logit_diff": rows_diff,
                "beside_other_seqs_diff": seqs_diff, "top_logprob_diff": top_diff}
    finally:
        ctx.close()
        model.close()


# The arms, each in a process of its own: ggml reads its tiled-matmul switch
# once per process (runtime/llama/library.py). Serve's default is the file's
# layout, "repacked" is --repack; "one-row kernel" is the file's layout with
# ggml's tiled matmul off, which --deterministic ran before llmctl's build
# made the tiled path exact.
ARMS = {"repacked": (True, None), "file layout": (False, None),
        "file layout, one-row kernel": (False, "0")}


def _arm(name: str, argv: list[str]) -> dict:
    repack, tiled = ARMS[name]
    env = {k: v for k, v in os.environ.items() if k != TILED_MATMUL_ENV}
    if tiled is not None:
        env[TILED_MATMUL_ENV] = tiled
    run = subprocess.run([sys.executable, __file__, *argv, f"--arm={name}"], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--context", type=int, default=200,
                    help="Tokens before the measured rows.")
    ap.add_argument("--flash-attn", choices=("on", "off"), default="on")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                    help="row counts to time, e.g. 1,2,9,33,65 for long drafts")
    ap.add_argument("--seqs", type=int, default=0,
                    help="also time one decode step of this many sequences, a row each")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = tuple(int(r) for r in args.rows.split(","))
    if args.arm:
        r = measure(resolve_model(args.model).path, ARMS[args.arm][0], args.threads,
                    args.repeat, args.context, args.flash_attn == "on", rows, args.seqs)
        print(json.dumps(r))
        return
    argv = [a for a in sys.argv[1:] if a != "--json"]
    result = {name: _arm(name, argv) for name in ARMS}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    print(f"{args.model}, {args.threads} threads, {args.context} tokens before, flash attention "
          f"{args.flash_attn}, medians of {args.repeat}")
    for name, r in result.items():
        ms = {int(k): v for k, v in r["ms"].items()}
        one = ms[1] if 1 in ms else next(iter(ms.values()))
        steps = ", ".join(f"{k} rows {v:.0f} ms ({v / one:.1f}x)" for k, v in ms.items())
        if r["seqs_ms"] is not None:
            steps += f", {args.seqs} sequences a row each {r['seqs_ms']:.0f} ms"
        print(f"{name:27}: {steps}; one-at-a-time vs together: max logit diff "
              f"{r['max_logit_diff']:.3g}; alone vs beside other sequences: "
              f"{r['beside_other_seqs_diff']:.3g}; top-10 logprob diff {r['top_logprob_diff']:.3g}")


if __name__ == "__main__":
    main()
