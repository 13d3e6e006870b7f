#!/usr/bin/env python3
"""Flash attention alone, one ggml op through ggml's C API
(runtime/llama/ggml_ops.py), in builds side by side: the installed one and
any others named with --lib (a directory holding libllama and ggml, as
LLAMA_CPP_LIB_PATH takes). Each arm runs in a process of its own, the arms
alternate round by round, and each shape reports the median ms per arm and
its ratio to the first arm.

A shape is ROWSxCELLS: ROWS query rows (the last ROWS of a causal prompt
of CELLS tokens) of every head over CELLS cells of K and V in f16, as a
prompt chunk (512 rows) or a decode step's heads (1 row) meets them.

    .venv/bin/python scripts/bench_attention.py [--shapes 512x2512,512x8192]
        [--heads 14 --kv-heads 2 --dim 64] [--lib NAME=DIR] [--rounds 3]
        [--repeat 7] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def _case(rows: int, cells: int, heads: int, kv_heads: int, dim: int):
    import numpy as np
    rng = np.random.default_rng(4)
    q = rng.standard_normal((heads, rows, dim)).astype(np.float32)
    k = rng.standard_normal((kv_heads, cells, dim)).astype(np.float16)
    v = rng.standard_normal((kv_heads, cells, dim)).astype(np.float16)
    mask = np.zeros((rows, cells), np.float16)
    for r in range(rows):
        mask[r, cells - rows + r + 1:] = -np.inf
    return q, k, v, mask


def _child(args) -> None:
    """Time each shape in this process's build; print {shape: ms}."""
    from llmctl.runtime.llama import ggml_ops
    out = {}
    for shape in args.shapes.split(","):
        rows, cells = (int(x) for x in shape.split("x"))
        q, k, v, mask = _case(rows, cells, args.heads, args.kv_heads, args.dim)
        ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=args.threads)
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            ggml_ops.flash_attn(q, k, v, mask, 0.125, threads=args.threads)
            times.append(time.perf_counter() - t)
        out[shape] = statistics.median(times) * 1000
    print(json.dumps(out))


def _arm(args, lib: str | None) -> dict:
    env = dict(os.environ)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
        env["LD_LIBRARY_PATH"] = lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    cmd = [sys.executable, __file__, "--child", "--shapes", args.shapes, "--heads",
           str(args.heads), "--kv-heads", str(args.kv_heads), "--dim", str(args.dim),
           "--repeat", str(args.repeat), "--threads", str(args.threads)]
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="512x2512,512x8192,64x8192,1x8192")
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--lib", action="append", default=[], help="NAME=DIR, another build")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args)
        return
    arms = [("installed", None)] + [tuple(s.split("=", 1)) for s in args.lib]
    got = {name: [] for name, _ in arms}
    for _ in range(args.rounds):
        for name, lib in arms:
            got[name].append(_arm(args, lib))
    first = arms[0][0]
    report = {}
    for shape in args.shapes.split(","):
        row = {name: round(statistics.median(r[shape] for r in runs), 2)
               for name, runs in got.items()}
        for name in got:
            if name != first:
                ratios = [a[shape] / b[shape] for a, b in zip(got[name], got[first], strict=True)]
                row[f"{name} / {first}"] = [round(statistics.median(ratios), 3),
                                            round(min(ratios), 3), round(max(ratios), 3)]
        report[shape] = row
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for shape, row in report.items():
        print(shape, "  ".join(f"{k}: {v}" for k, v in row.items()))


if __name__ == "__main__":
    main()
