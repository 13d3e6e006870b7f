#!/usr/bin/env python3
"""This tree against an earlier release, side by side in one run: the
serving, prefix-cache and single-stream benchmarks, each run by both
trees' own scripts under both trees' own interpreters, alternating round by
round so machine drift hits both. Prints the ratios new / base.

    .venv/bin/python scripts/bench_release.py --base-python /tmp/basevenv/bin/python \\
        --base-tree /tmp/base [--rounds 2] [--model smollm2]

The base interpreter must import the base tree's llmctl (a venv with that
tree installed editable; its other packages may come from this venv).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]


def run(python: str, tree: Path, script: str, *args: str) -> str:
    """Run `tree/scripts/script` with `python` from `tree`; return its stdout."""
    done = subprocess.run([python, str(tree / "scripts" / script), *args], cwd=tree,
                          capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise SystemExit(f"{script} failed under {python}:\n{done.stderr[-2000:]}")
    return done.stdout


def serve(python: str, tree: Path, model: str) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "serve.json"
        run(python, tree, "bench_serve.py", "--skip-peers", "--rounds", "1", "--model", model,
            "--json", str(out))
        r = json.loads(out.read_text())["medians"]["llmctl serve"]
    return {"serve c=1 tok/s": r["c1"]["tok_s"], "serve c=16 tok/s": r["c16"]["tok_s"],
            "serve c=16 TTFT p50 s": r["c16"]["ttft_p50"]}


def prefix_cache(python: str, tree: Path, model: str) -> dict[str, float]:
    text = run(python, tree, "bench_prefix_cache.py", "--model", model, "--json")
    r = json.loads(text[text.index("{"):])
    t = r["ttft"]
    return {"prefix cold TTFT s": t["cold_ttft_s"], "prefix memory-hit TTFT s": t["memory_hit_ttft_s"],
            "prefix disk-hit TTFT s": t["disk_hit_ttft_s"],
            "prefix shared c=16 tok/s": r["throughput"]["llmctl"]["tok_per_s"]}


def single_stream(python: str, tree: Path, model: str) -> dict[str, float]:
    text = run(python, tree, "bench_single_stream.py", "--rounds", "3")
    ours = float(re.search(r"llmctl run\s+([\d.]+) tok/s", text.split("median over")[1]).group(1))
    ratio = float(re.search(r"median per-round ratio\s+([\d.]+)", text).group(1))
    return {"single stream tok/s": ours, "single stream / tight loop": ratio}


BENCHES = {"serve": serve, "prefix": prefix_cache, "single": single_stream}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-python", required=True)
    ap.add_argument("--base-tree", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--only", choices=sorted(BENCHES), action="append")
    args = ap.parse_args()
    sides = {"base": (args.base_python, args.base_tree), "new": (sys.executable, HERE)}
    got: dict[str, dict[str, list[float]]] = {"base": {}, "new": {}}
    for i in range(args.rounds):
        order = list(sides) if i % 2 == 0 else list(reversed(sides))
        for bench in args.only or list(BENCHES):
            for side in order:
                python, tree = sides[side]
                figures = BENCHES[bench](python, tree, args.model)
                print(f"round {i + 1} {side:4} {json.dumps(figures)}", flush=True)
                for k, v in figures.items():
                    got[side].setdefault(k, []).append(v)
    print(f"\nmedians over {args.rounds} rounds, model {args.model}")
    print(f"{'figure':30} {'base':>9} {'new':>9} {'new/base':>9}")
    for k, base in got["base"].items():
        b, n = statistics.median(base), statistics.median(got["new"][k])
        print(f"{k:30} {b:9.3f} {n:9.3f} {n / b:9.3f}")


if __name__ == "__main__":
    main()
