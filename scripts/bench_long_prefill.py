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
tokens during the prefill are counted too. With --decode K a prompt alone
goes on for K tokens (ignore_eos), and their rate is decode tok/s after it.

    .venv/bin/python scripts/bench_long_prefill.py [--model qwen2.5-coder-0.5b]
        [--sizes 2048,8192,16384] [--beside 0,2] [--rounds 1] [--threads 2]
        [--variant NAME='SERVE FLAGS'] [--peer NAME='LLAMA-SERVER FLAGS']
        [--decode K] [--tree NAME=DIR] [--against NAME] [--json]

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
from llmctl.bench.launcher import Server, source_tree, variant
from llmctl.errors import UsageError

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


def prefill(url: str, model: str, n_tokens: int, seed: int, decode: int = 0) -> dict:
    """One prompt's prefill tok/s (prompt tokens over TTFT); with `decode`,
    that many more tokens (ignore_eos) and their decode tok/s after it."""
    body = {"model": model, "max_tokens": 1 + decode, "temperature": 0, "stream": True,
            "ignore_eos": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": prompt(n_tokens, seed)}]}
    t0 = time.perf_counter()
    ttft, usage, last = None, {}, 0.0
    with httpx.Client(timeout=7200) as client, \
            client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r.iter_lines()):
            usage = chunk.get("usage") or usage
            # The first token, not a first chunk that only names the role.
            if any(c.get("delta", {}).get("content") or c.get("finish_reason")
                   for c in chunk.get("choices", [])):
                last = time.perf_counter() - t0
                ttft = last if ttft is None else ttft
    ttft = ttft or time.perf_counter() - t0
    n = usage.get("prompt_tokens") or n_tokens
    got = {"prompt_tokens": n, "ttft_s": round(ttft, 3), "tok_s": round(n / ttft, 2)}
    if decode:
        # The server's count: a streamed chunk may carry more than one token.
        made = (usage.get("completion_tokens") or 1 + decode) - 1
        got["decode_tok_s"] = round(made / max(last - ttft, 1e-9), 2)
    return got


def measure(url: str, model: str, n_tokens: int, beside: int, seed: int, ctx: int,
            decode: int = 0) -> dict:
    decoders = [Decoder(url, model, seed * 100 + i, ctx - 200) for i in range(beside)]
    for d in decoders:
        d.start()
    for d in decoders:
        if not d.started.wait(600) or d.error:
            raise RuntimeError(f"a decoding stream gave no token: {d.error or 'in 600 s'}")
    before = [d.tokens for d in decoders]
    got = prefill(url, model, n_tokens, seed, decode if not decoders else 0)
    if decoders:
        got["beside_tok_s"] = round(sum(d.tokens - b for d, b in zip(decoders, before, strict=True))
                                    / got["ttft_s"], 2)
    for d in decoders:
        d.stop.set()
    for d in decoders:
        d.join(60)
    return got


def _arms(args: argparse.Namespace, path: str, ctx: int, slots: int) -> dict[str, Server]:
    """The servers, not started: llmctl, its variants and trees, and
    llama-server with its variants when it is there."""
    # No prefix-cache hit is involved: every prompt is new from its first
    # token. The disk store still saves each prompt, as a user's server does.
    common = ["--ctx-size", str(ctx), "--max-num-seqs", str(slots), "--threads", str(args.threads)]
    arms: dict[str, Server] = {"llmctl": Server.llmctl_serve(args.model, *common,
                                                             startup_timeout=900)}
    for label, flags in map(variant, args.variant):
        arms[f"llmctl {label}"] = Server.llmctl_serve(args.model, *common, *flags,
                                                      startup_timeout=900)
    for label, tree in map(source_tree, args.tree):
        arms[f"llmctl {label}"] = Server.llmctl_serve(args.model, *common, tree=tree,
                                                      startup_timeout=900)
    if args.llama_server.exists() and not args.skip_peers:
        peer = [str(args.llama_server), "-m", path, "--jinja", "-np", str(slots),
                "-c", str(ctx * slots), "--threads", str(args.threads), "--no-webui"]
        arms["llama-server"] = Server(peer, startup_timeout=900)
        for label, flags in map(variant, args.peer):
            arms[f"llama-server {label}"] = Server(peer + flags, startup_timeout=900)
    return arms


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--sizes", default="2048,8192,16384")
    ap.add_argument("--beside", default="0,2", help="decoding streams beside the prefill")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variant", action="append", default=[], help="NAME='SERVE FLAGS'")
    ap.add_argument("--peer", action="append", default=[],
                    help="NAME='LLAMA-SERVER FLAGS': another llama-server arm, e.g. fa-off='-fa off'")
    ap.add_argument("--decode", type=int, default=0,
                    help="also generate this many tokens after a prompt alone: decode tok/s")
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=DIR: one more llmctl arm, run from the source tree DIR")
    ap.add_argument("--against", action="append", default=[], metavar="NAME",
                    help="also report every llmctl arm against the llmctl arm NAME "
                         "(a --variant or --tree name)")
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
    try:
        arms = _arms(args, path, ctx, slots)
    except UsageError as e:
        ap.error(str(e))
    against = [f"llmctl {name}" for name in args.against]
    if not set(against) <= set(arms):
        ap.error(f"--against: no arm named {', '.join(sorted(set(against) - set(arms)))}")
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
                        got = measure(srv.url, args.model, n, k, seed, ctx, args.decode)
                        rows.append({"round": rnd, "size": n, "beside": k, "arm": name, **got})
                        print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        for srv in arms.values():
            srv.stop()
    print(json.dumps(summary(rows, list(arms), against), indent=None if args.json else 2))


def summary(rows: list[dict], arms: list[str], against: list[str] | None = None) -> dict:
    """Median prefill (and decode) tok/s per size, beside count and arm, and
    each llmctl arm's ratio to each llama-server arm and to each `against`
    arm: [median, min, max] of the per-round ratios."""
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
            if got and "decode_tok_s" in got[0]:
                cell[f"{arm} decode tok/s"] = statistics.median(r["decode_tok_s"] for r in got)
        peers = [a for a in arms if a.startswith("llama-server")] + list(against or [])
        for arm in (a for a in arms if a not in peers):
            for peer in peers:
                for key, what in (("tok_s", ""), ("decode_tok_s", " decode")):
                    if key not in (by_arm[arm] or [{}])[0]:
                        continue
                    ratios = [a[key] / b[key]
                              for a, b in zip(by_arm[arm], by_arm[peer], strict=True)]
                    cell[f"{arm} / {peer}{what}"] = [round(statistics.median(ratios), 3),
                                                     round(min(ratios), 3), round(max(ratios), 3)]
        out["cells"].append(cell)
    return out


if __name__ == "__main__":
    sys.exit(main())
