#!/usr/bin/env python3
"""Prefix-cache benchmark against `llmctl serve`, in one run.

1. TTFT: ~1000 shared + ~20 distinct prompt tokens, 16 generated. Cold
   (fresh cache dir), memory hit (another suffix, same server), disk hit
   (another suffix after a full server restart on the same cache dir; one
   unrelated warm-up request first, so graph set-up is not counted).
2. Throughput with a shared system prompt the server has not seen: 32
   requests at concurrency 16, ~500 shared + ~40 distinct tokens, 64
   generated with ignore_eos. llmctl with and without --no-prefix-cache, and
   llama-server (-np 16) when /tmp/llama-server-build/bin/llama-server exists.

`--tree NAME=DIR` also runs both parts with the llmctl of another source
tree (a commit's parent, checked out with `git worktree add`), in turns
with this one, to measure a change against it side by side.

Usage: .venv/bin/python scripts/bench_prefix_cache.py [--model smollm2] [--threads 2] [--json]
    [--tree NAME=DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmctl.bench.launcher import Server

MODEL = "smollm2"       # the served name; llama-server ignores it
LLAMA_SERVER = Path("/tmp/llama-server-build/bin/llama-server")
WORDS = ("river stone lamp garden window copper forest signal harbor violet engine "
         "meadow silver thunder candle orbit marble whisper lantern canyon").split()


def text(n_words: int, seed: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def llmctl_server(args, home: str, ctx: int, seqs: int, extra: list[str],
                  tree: Path | None = None) -> Server:
    return Server.llmctl_serve(args.model, "--ctx-size", str(ctx), "--max-num-seqs", str(seqs),
                               "--threads", str(args.threads), *extra,
                               env={"LLMCTL_HOME": home}, tree=tree)


def llama_server(args, ctx: int, seqs: int, model_path: str) -> Server:
    return Server([str(LLAMA_SERVER), "-m", model_path, "-np", str(seqs), "-c", str(ctx * seqs),
                   "--threads", str(args.threads), "--no-webui"])


async def complete(client: httpx.AsyncClient, url: str, prompt: str, max_tokens: int,
                   ignore_eos: bool = False) -> dict:
    body = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "stream": True, "ignore_eos": ignore_eos}
    t0 = time.perf_counter()
    ttft, n = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                ttft = ttft or time.perf_counter() - t0
                n += 1
    return {"ttft": ttft or time.perf_counter() - t0, "chunks": n}


def one(url: str, prompt: str, max_tokens: int = 16) -> float:
    async def go():
        async with httpx.AsyncClient(timeout=600) as c:
            return (await complete(c, url, prompt, max_tokens))["ttft"]
    return asyncio.run(go())


def ttft_bench(args, tree: Path | None = None) -> dict:
    shared = text(850, 1)            # about 1,000 tokens
    asks = [f" Question {i}: " + text(14, 100 + i) for i in range(3)]   # about 20 tokens
    home = tempfile.mkdtemp(prefix="llmctl-bench-")
    with llmctl_server(args, home, 2048, 4, [], tree) as srv:
        one(srv.url, "Hello there.", 4)             # graph set-up, not the prefix
        cold = one(srv.url, shared + asks[0])
        mem = one(srv.url, shared + asks[1])
    # The server has exited, so its cache writer has flushed.
    with llmctl_server(args, home, 2048, 4, [], tree) as srv:
        one(srv.url, "Hello there.", 4)
        disk = one(srv.url, shared + asks[2])
        stats = httpx.get(srv.url + "/stats").json()
    return {"cold_ttft_s": cold, "memory_hit_ttft_s": mem, "disk_hit_ttft_s": disk,
            "memory_ratio": mem / cold, "disk_ratio": disk / cold,
            "disk_hit_tokens": stats.get("prefix_cache_hit_tokens")}


async def load_run(url: str, n: int, conc: int, max_tokens: int) -> dict:
    system = text(420, 7)            # about 500 tokens, new to the server
    prompts = [system + f"\nUser {i}: " + text(30, 1000 + i) for i in range(n)]
    sem = asyncio.Semaphore(conc)
    results = []

    # A fresh connection per request: llama-server closes kept-alive
    # connections between requests, which a pooled client sees as a failure.
    limits = httpx.Limits(max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as client:
        async def worker(p):
            async with sem:
                results.append(await complete(client, url, p, max_tokens, ignore_eos=True))
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(p) for p in prompts))
        wall = time.perf_counter() - t0
    ttfts = sorted(r["ttft"] for r in results)
    return {"wall_s": wall, "tok_per_s": n * max_tokens / wall,
            "ttft_p50_s": statistics.median(ttfts),
            "ttft_p95_s": ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))]}


def throughput_bench(args, model_path: str, trees: dict[str, Path]) -> dict:
    out = {}
    configs: list[tuple[str, list[str], Path | None]] = [
        ("llmctl", [], None), ("llmctl --flash-attn off", ["--flash-attn", "off"], None),
        ("llmctl --no-prefix-cache", ["--no-prefix-cache"], None)]
    # Another tree's arm goes beside this tree's default, in turns.
    for name, tree in trees.items():
        configs.insert(1, (f"llmctl {name}", [], tree))
        configs.append((f"llmctl (again beside {name})", [], None))
    for name, extra, tree in configs:
        with llmctl_server(args, tempfile.mkdtemp(prefix="llmctl-bench-"), 1024, 16,
                           ["--max-queued", "64", *extra], tree) as srv:
            out[name] = asyncio.run(load_run(srv.url, 32, 16, 64))
        print(name, out[name], file=sys.stderr)
    if LLAMA_SERVER.exists():
        with llama_server(args, 1024, 16, model_path) as srv:
            out["llama-server -np 16"] = asyncio.run(load_run(srv.url, 32, 16, 64))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="also run the llmctl of another source tree (repeatable)")
    args = ap.parse_args()
    trees = {name: Path(d) for name, _, d in (t.partition("=") for t in args.tree)}
    global MODEL
    MODEL = args.model
    from llmctl.store.resolve import resolve_model

    model_path = str(resolve_model(args.model).path)
    report = {"ttft": ttft_bench(args)}
    print("ttft", report["ttft"], file=sys.stderr)
    for name, tree in trees.items():
        report[f"ttft {name}"] = ttft_bench(args, tree)
        report["ttft (again)"] = ttft_bench(args)
    if not args.skip_throughput:
        report["throughput"] = throughput_bench(args, model_path, trees)
        base = report["throughput"].get("llama-server -np 16") or \
            report["throughput"]["llmctl --no-prefix-cache"]
        report["throughput_ratio"] = report["throughput"]["llmctl"]["tok_per_s"] / base["tok_per_s"]
    if args.json:
        print(json.dumps(report, indent=1))
        return
    for key in [k for k in report if k.startswith("ttft")]:
        t = report[key]
        print(f"{key}: cold {t['cold_ttft_s']:.3f} s | memory hit {t['memory_hit_ttft_s']:.3f} s "
              f"({t['memory_ratio']:.3f}x) | disk hit after restart {t['disk_hit_ttft_s']:.3f} s "
              f"({t['disk_ratio']:.3f}x)")
    for name, r in report.get("throughput", {}).items():
        print(f"{name:28s} {r['tok_per_s']:7.1f} tok/s  TTFT p50 {r['ttft_p50_s']:.2f} s "
              f"p95 {r['ttft_p95_s']:.2f} s  wall {r['wall_s']:.1f} s")
    if "throughput_ratio" in report:
        print(f"throughput ratio llmctl / baseline: {report['throughput_ratio']:.2f}x")


if __name__ == "__main__":
    main()
