#!/usr/bin/env python3
"""The K-quant matmul alone, weights in their file's layout (serve's
default), at each activation row count: ggml's op through its C API
(runtime/llama/ggml_ops.py) on the shapes of Qwen2.5-Coder-1.5B's layers, so
a kernel's speed shows without the rest of a step. `--lib NAME=DIR` adds a
build to compare (a directory holding libllama and ggml, as
LLAMA_CPP_LIB_PATH takes it). Each build runs in a process of its own, the
order reverses every other round, and every build's outputs are compared
bit for bit with the first's: llmctl's kernels must round as the tiles do.
`Q8_K:1xK` times the step before every K-quant matmul instead: n rows of K
activations converted to Q8_K.

    .venv/bin/python scripts/bench_matmul.py [--rows 1,4,8,16,32,64]
        [--shapes Q4_K:8960x1536,Q6_K:1536x8960,Q8_K:1x8960] [--threads 2] [--repeat 40]
        [--rounds 3] [--lib before=/tmp/oldlib] [--json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from llmctl.runtime.llama import ggml_ops

# Qwen2.5-Coder-1.5B Q4_K_M: FFN up and gate, FFN down (Q4_K and Q6_K
# layers), attention Q and output, K and V
SHAPES = "Q4_K:8960x1536,Q4_K:1536x8960,Q6_K:1536x8960,Q4_K:1536x1536,Q4_K:256x1536,Q6_K:256x1536"
TYPES = {"Q4_K": ggml_ops.Q4_K, "Q6_K": ggml_ops.Q6_K, "Q8_K": ggml_ops.Q8_K}
THIS = "this build"


def parse_shapes(text: str) -> list[tuple[str, int, int]]:
    """"Q4_K:8960x1536,..." -> [("Q4_K", 8960, 1536), ...] (rows x k)."""
    out = []
    for item in text.split(","):
        name, _, dims = item.partition(":")
        rows, _, k = dims.partition("x")
        if (name not in TYPES or not rows.isdigit() or not k.isdigit() or int(k) % 256
                or (name == "Q8_K" and rows != "1")):
            raise SystemExit(f"bad shape {item!r}: TYPE:ROWSxK, TYPE one of {sorted(TYPES)}, "
                             "K a multiple of 256, ROWS 1 for Q8_K")
        out.append((name, int(rows), int(k)))
    return out


def measure(shapes, rows_list, threads: int, repeat: int) -> dict:
    """Median ms of each (shape, rows), and a digest of the outputs."""
    rng = np.random.default_rng(0)
    ms, digest = {}, hashlib.sha256()
    for name, rows, k in shapes:
        w = rng.standard_normal((rows, k)).astype(np.float32)
        x = rng.standard_normal((max(rows_list), k)).astype(np.float32)
        for n in rows_list:
            times = [0.0] * repeat
            if name == "Q8_K":   # one thread's conversion of n rows
                digest.update(ggml_ops.quantize_q8_K(x[:n], times=times))
            else:
                out = ggml_ops.matmul(TYPES[name], w, x[:n], threads=threads, times=times)
                digest.update(out.tobytes())
            ms[f"{name}:{rows}x{k}:{n}"] = 1e3 * statistics.median(times)
    return {"ms": ms, "digest": digest.hexdigest()}


def _arm(lib: str | None, argv: list[str]) -> dict:
    env = dict(os.environ)
    if lib:
        env["LLAMA_CPP_LIB_PATH"] = lib
    run = subprocess.run([sys.executable, __file__, *argv, "--arm"], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(run.stdout.splitlines()[-1])


def _table(runs: dict[str, list[dict]]) -> list[dict]:
    """Per shape and row count: each build's median ms over the rounds, and
    each later build's over the first's (median of per-round ratios, range)."""
    names = list(runs)
    base = runs[names[0]]
    rows = []
    for key in base[0]["ms"]:
        row = {"case": key, **{n: statistics.median(r["ms"][key] for r in runs[n]) for n in names}}
        for n in names[1:]:
            ratios = [o["ms"][key] / b["ms"][key] for o, b in zip(runs[n], base, strict=True)]
            row[f"{n} / {names[0]}"] = (statistics.median(ratios), min(ratios), max(ratios))
        rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", default="1,4,8,16,32,64")
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--lib", action="append", default=[], metavar="NAME=DIR")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--arm", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    shapes = parse_shapes(args.shapes)
    rows_list = [int(v) for v in args.rows.split(",")]
    if args.arm:
        print(json.dumps(measure(shapes, rows_list, args.threads, args.repeat)))
        return
    libs = {THIS: None}
    for item in args.lib:
        name, sep, path = item.partition("=")
        if not sep or not os.path.isdir(path):
            raise SystemExit(f"--lib {item!r}: NAME=DIR, DIR a directory holding libllama")
        libs[name] = path
    argv = ["--rows", args.rows, "--shapes", args.shapes, "--threads", str(args.threads),
            "--repeat", str(args.repeat)]
    runs: dict[str, list[dict]] = {name: [] for name in libs}
    for rnd in range(args.rounds):
        for name in (list(libs) if rnd % 2 == 0 else list(libs)[::-1]):
            runs[name].append(_arm(libs[name], argv))
            print(f"round {rnd + 1}: {name} done", file=sys.stderr)
    same = {n: all(r["digest"] == runs[THIS][0]["digest"] for r in runs[n]) for n in libs}
    table = _table(runs)
    if args.json:
        print(json.dumps({"libs": libs, "same_bits": same, "table": table}))
        return
    names = list(libs)
    print("case | " + " | ".join(f"{n} ms" for n in names)
          + "".join(f" | {n} / {names[0]}" for n in names[1:]))
    for row in table:
        cells = [f"{row[n]:.3f}" for n in names]
        cells += ["{:.2f} ({:.2f}-{:.2f})".format(*row[f"{n} / {names[0]}"]) for n in names[1:]]
        print(f"{row['case']} | " + " | ".join(cells))
    print("outputs bit for bit as this build's: "
          + ", ".join(f"{n} {'yes' if ok else 'NO'}" for n, ok in same.items()))


if __name__ == "__main__":
    main()
