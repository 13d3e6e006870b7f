#!/usr/bin/env python3
"""Long prompts through the servers: `llmctl serve` against llama-server on
the same GGUF, side by side in one run, both up for the whole run and each
measured while the other is idle.

A coding agent's first turn is one long prefill. Each measurement sends one
prompt of about N tokens (new words from its first token, so nothing is
cached) with max_tokens 1, and reports the server's prompt tokens over its
time to first token: prefill tok/s. With --beside K it first starts K
long-running generations on short prompts and waits for their first tokens,
so the prefill shares the machine's steps with K decoding streams; their
tokens during the prefill are counted too.

    .venv/bin/python scripts/bench_long_prefill.py [--model qwen2.5-coder-0.5b]
        [--sizes 2048,8192,16384] [--beside 0,2] [--rounds 1] [--threads 2]
        [--variant NAME='SERVE FLAGS'] [--json]

llama-server runs with its defaults (flash attention auto) and the same
slots and per-slot context as llmctl; it is looked for at $LLAMA_SERVER or
/tmp/llama-server-build/bin/llama-server (scripts/build_llama_server.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

from llmctl.bench.client import sse_chunks
from llmctl.bench.launcher import Server, variant

WORDS = ("file test module edit read run check branch commit patch diff build lint type "
         "error path line function class import return value config server client").split()
TOKENS_PER_WORD = 1.1   # these words are mostly one token each, with spaces


def prompt(n_tokens: int, seed: int) -> str:
    rnd = random.Random(seed)
    head = f"Request {seed}: {rnd.random():.12f}\n"
    return head + " ".join(rnd.choice(WORDS) for _ in range(int(n_tokens / TOKENS_PER_WORD)))


class Decoder(threading.Thread):
    """One generation that runs until stopped, counting its tokens."""

    def __init__(self, url: str, model: str, seed: int, max_tokens: int):
        super().__init__(daemon=True)
        self.url, self.model, self.seed, self.max_tokens = url, model, seed, max_tokens
        self.started = threading.Event()
        self.stop = threading.Event()
        self.tokens = 0
        self.error: str | None = None

    def run(self) -> None:
        body = {"model": self.model, "max_tokens": self.max_tokens, "ignore_eos": True,
                "temperature": 0, "stream": True,
                "messages": [{"role": "user", "content": prompt(60, self.seed)}]}
        with httpx.Client(timeout=3600) as client, \
                client.stream("POST", self.url + "/v1/chat/completions", json=body) as r:
            if r.status_code != 200:
                self.error = f"{r.status_code}: {r.read().decode()[:300]}"
                self.started.set()
                return
            for chunk in sse_chunks(r.iter_lines()):
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    self.tokens += 1
                    self.started.set()
                if self.stop.is_set():
                    return     # leaving closes the stream: the server cancels it


def prefill(url: str, model: str, n_tokens: int, seed: int) -> dict:
    body = {"model": model, "max_tokens": 1, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt(n_tokens, seed)}]}
    t0 = time.perf_counter()
    ttft, usage = None, {}
    with httpx.Client(timeout=7200) as client, \
            client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r.iter_lines()):
            usage = chunk.get("usage") or usage
            # The first token, not a first chunk that only names the role.
            if ttft is None and any(c.get("delta", {}).get("content") or c.get("finish_reason")
                                    for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - t0
    ttft = ttft or time.perf_counter() - t0
    n = usage.get("prompt_tokens") or n_tokens
    return {"prompt_tokens": n, "ttft_s": round(ttft, 3), "tok_s": round(n / ttft, 2)}


def measure(url: str, model: str, n_tokens: int, beside: int, seed: int, ctx: int) -> dict:
    decoders = [Decoder(url, model, seed * 100 + i, ctx - 200) for i in range(beside)]
    for d in decoders:
        d.start()
    for d in decoders:
        if not d.started.wait(600) or d.error:
            raise RuntimeError(f"a decoding stream gave no token: {d.error or 'in 600 s'}")
    before = [d.tokens for d in decoders]
    got = prefill(url, model, n_tokens, seed)
    if decoders:
        got["beside_tok_s"] = round(sum(d.tokens - b for d, b in zip(decoders, before, strict=True))
                                    / got["ttft_s"], 2)
    for d in decoders:
        d.stop.set()
    for d in decoders:
        d.join(60)
    return got


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--sizes", default="2048,8192,16384")
    ap.add_argument("--beside", default="0,2", help="decoding streams beside the prefill")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME='SERVE FLAGS'")
    ap.add_argument("--skip-peers", action="store_true", help="no llama-server arm")
    ap.add_argument("--llama-server", type=Path, default=Path(os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from llmctl.store.resolve import resolve_model

    sizes = [int(s) for s in args.sizes.split(",")]
    besides = [int(b) for b in args.beside.split(",")]
    slots = max(besides) + 1
    ctx = max(sizes) + 512
    path = str(resolve_model(args.model).path)
    # No prefix cache is involved: every prompt is new from its first token.
    common = ["--ctx-size", str(ctx), "--max-num-seqs", str(slots), "--threads", str(args.threads)]
    arms: dict[str, Server] = {"llmctl": Server.llmctl_serve(args.model, *common,
                                                             startup_timeout=900)}
    for label, flags in map(variant, args.variant):
        arms[f"llmctl {label}"] = Server.llmctl_serve(args.model, *common, *flags,
                                                      startup_timeout=900)
    if args.llama_server.exists() and not args.skip_peers:
        arms["llama-server"] = Server([str(args.llama_server), "-m", path, "--jinja",
                                       "-np", str(slots), "-c", str(ctx * slots),
                                       "--threads", str(args.threads), "--no-webui"],
                                      startup_timeout=900)
    rows: list[dict] = []
    try:
        for srv in arms.values():
            srv.start()
        for srv in arms.values():
            srv.wait_ready()
        seed = random.randrange(1 << 30)
        for rnd in range(args.rounds):
            for n in sizes:
                for k in besides:
                    for name, srv in arms.items():
                        seed += 1
                        got = measure(srv.url, args.model, n, k, seed, ctx)
                        rows.append({"round": rnd, "size": n, "beside": k, "arm": name, **got})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        for srv in arms.values():
            srv.stop()
    print(json.dumps(summary(rows, list(arms)), indent=None if args.json else 2))


def summary(rows: list[dict], arms: list[str]) -> dict:
    """Median prefill tok/s per size, beside count and arm, and each llmctl
    arm's ratio to llama-server (medians of per-round ratios)."""
    out: dict = {"rows": rows, "cells": []}
    keys = sorted({(r["size"], r["beside"]) for r in rows})
    for size, beside in keys:
        cell: dict = {"size": size, "beside": beside}
        by_arm = {a: [r for r in rows if (r["size"], r["beside"], r["arm"]) == (size, beside, a)]
                  for a in arms}
        for arm, got in by_arm.items():
            cell[arm] = statistics.median(r["tok_s"] for r in got)
            if beside:
                cell[f"{arm} beside tok/s"] = statistics.median(r["beside_tok_s"] for r in got)
        if "llama-server" in by_arm:
            for arm in (a for a in arms if a != "llama-server"):
                ratios = [a["tok_s"] / b["tok_s"]
                          for a, b in zip(by_arm[arm], by_arm["llama-server"], strict=True)]
                cell[f"{arm} / llama-server"] = round(statistics.median(ratios), 3)
        out["cells"].append(cell)
    return out


if __name__ == "__main__":
    sys.exit(main())
