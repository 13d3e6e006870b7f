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

A list of contexts, `--flash-attn on,off`, `--arms` or `--rounds N` sweeps
them instead, each round running every combination in turn, and prints a
table of medians with each mode's time over the first's, e.g. llmctl's
attention kernel against ggml's path without flash attention:

    .venv/bin/python scripts/bench_rows.py --model qwen2.5-coder-0.5b --arms "file layout"
        --flash-attn on,off --context 64,1000,4000,16000 --rows 1,512 --rounds 3
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


def _sweep(args, contexts: list[int], modes: list[str], arms: list[str]) -> list[dict]:
    """Each round runs every context, arm and attention mode once, one after
    the other, so drift on the machine spreads over all of them alike."""
    out = []
    for rnd in range(args.rounds):
        for context in contexts:
            for arm in arms:
                for mode in modes:
                    argv = ["--model", args.model, "--threads", str(args.threads), "--repeat",
                            str(args.repeat), "--context", str(context), "--flash-attn", mode,
                            "--rows", args.rows, "--seqs", str(args.seqs)]
                    r = _arm(arm, argv)
                    out.append({"round": rnd, "context": context, "arm": arm, "flash_attn": mode,
                                **r})
                    print(f"round {rnd + 1}, {context} tokens, {arm}, flash attention {mode}: "
                          + ", ".join(f"{k} rows {v:.1f} ms" for k, v in r["ms"].items()),
                          file=sys.stderr)
    return out


def _sweep_table(runs: list[dict], modes: list[str]) -> None:
    """Per context, arm and row count: each mode's median ms over the rounds,
    and each later mode's time over the first's (median of per-round ratios,
    range)."""
    base, others = modes[0], modes[1:]
    keys = sorted({(r["context"], r["arm"]) for r in runs})
    print("context | arm | rows | " + " | ".join(f"flash {m} ms" for m in modes)
          + "".join(f" | {m} / {base} (range)" for m in others))
    for context, arm in keys:
        mine = [r for r in runs if r["context"] == context and r["arm"] == arm]
        for rows in mine[0]["ms"]:
            by_mode = {m: [r["ms"][rows] for r in mine if r["flash_attn"] == m] for m in modes}
            cells = [f"{statistics.median(by_mode[m]):.1f}" for m in modes]
            for m in others:
                ratios = [o / b for o, b in zip(by_mode[m], by_mode[base], strict=True)]
                cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-"
                             f"{max(ratios):.2f})")
            print(f"{context} | {arm} | {rows} | " + " | ".join(cells))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=6)
    ap.add_argument("--context", default="200",
                    help="tokens before the measured rows; a list sweeps them")
    ap.add_argument("--flash-attn", default="on",
                    help="on, off, or on,off to time both side by side")
    ap.add_argument("--rows", default=",".join(map(str, ROWS)),
                    help="row counts to time, e.g. 1,2,9,33,65 for long drafts")
    ap.add_argument("--seqs", type=int, default=0,
                    help="also time one decode step of this many sequences, a row each")
    ap.add_argument("--arms", action="append", choices=list(ARMS),
                    help="a weight arm to run (repeat it for more; all by default)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--arm", choices=sorted(ARMS), help=argparse.SUPPRESS)
    args = ap.parse_args()
    rows = tuple(int(r) for r in args.rows.split(","))
    contexts = [int(c) for c in args.context.split(",")]
    modes = args.flash_attn.split(",")
    arms = args.arms or list(ARMS)
    if not set(modes) <= {"on", "off"}:
        ap.error("--flash-attn takes on, off, or on,off")
    if args.arm:
        r = measure(resolve_model(args.model).path, ARMS[args.arm][0], args.threads,
                    args.repeat, contexts[0], modes[0] == "on", rows, args.seqs)
        print(json.dumps(r))
        return
    if len(contexts) > 1 or len(modes) > 1 or args.rounds > 1 or len(arms) < len(ARMS):
        runs = _sweep(args, contexts, modes, arms)
        if args.json:
            print(json.dumps(runs, indent=1))
        else:
            _sweep_table(runs, modes)
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
