#!/usr/bin/env python3
"""Speculative decoding through the servers, side by side in one run (issue
14): `llmctl serve` with no speculation, `--spec ngram` and `--draft`, and
llama-server with none, its n-gram mode and the same draft (`-md`), on the
same GGUFs and threads.

Workloads: a code edit (rewrite a ~300-token function with one small
change) and a chat answer. Single stream: decode tok/s (tokens after the
first over the time after the first), greedy, with each answer compared to
plain decoding's. Then llmctl at concurrency 8 and 16 (half edits, half
chats) with each speculation mode against none: generated tokens over wall
time. Acceptance comes from each server's own counters (llmctl's /stats,
llama-server's per-response timings).

    .venv/bin/python scripts/bench_draft.py [--target qwen2.5-coder-1.5b]
        [--draft qwen2.5-coder-0.5b] [--tokens 128] [--levels 8,16] [--json]
        [--llama-server PATH | --skip-peers]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from llmctl.bench.client import stream_chat
from llmctl.bench.launcher import Server
from llmctl.store.resolve import resolve_model

FUNCTION = '''def summarize_orders(orders, tax_rate=0.2, currency="EUR"):
    """Group orders by customer and return per-customer totals."""
    result = {}
    for order in orders:
        customer = order.get("customer")
        if customer is None:
            continue
        lines = order.get("lines", [])
        total = 0.0
        for line in lines:
            quantity = int(line.get("quantity", 0))
            price = float(line.get("price", 0.0))
            if quantity <= 0 or price < 0:
                raise ValueError(f"bad line in order {order.get('id')}: {line}")
            total += quantity * price
        discount = order.get("discount", 0.0)
        if discount:
            total = total * (1.0 - discount)
        tax = total * tax_rate
        entry = result.setdefault(customer, {"orders": 0, "net": 0.0, "tax": 0.0})
        entry["orders"] += 1
        entry["net"] += round(total, 2)
        entry["tax"] += round(tax, 2)
        entry["currency"] = currency
    for customer, entry in result.items():
        entry["gross"] = round(entry["net"] + entry["tax"], 2)
        entry["average"] = round(entry["gross"] / entry["orders"], 2)
    return dict(sorted(result.items(), key=lambda item: -item[1]["gross"]))
'''
PROMPTS = {
    "edit": "Rewrite this Python function, renaming the variable `total` to `subtotal` and "
            "changing nothing else. Reply with the code only.\n\n" + FUNCTION,
    "chat": "Explain how a hash table handles collisions, with the trade-offs of chaining "
            "and open addressing, in a few paragraphs.",
}
SLOTS = 16
CTX_PER_SEQ = 1024


def stream(url: str, kind: str, tokens: int, model: str) -> dict:
    """One greedy streamed chat request of one kind (stream_chat)."""
    return {"kind": kind, **stream_chat(url, model, PROMPTS[kind], tokens)}


def spec_counts(url: str) -> tuple[int, int, int]:
    s = httpx.get(url + "/stats", timeout=30).json()
    return s["spec_steps"], s["spec_drafted_tokens"], s["spec_accepted_tokens"]


def single(url: str, model: str, tokens: int, ours: bool) -> dict:
    out = {}
    stream(url, "chat", 8, model)      # warm-up
    for kind in PROMPTS:
        before = spec_counts(url) if ours else None
        r = stream(url, kind, tokens, model)
        if ours:
            after = spec_counts(url)
            r["steps"], r["drafted"], r["accepted"] = (a - b for a, b in zip(after, before, strict=False))
        out[kind] = r
    return out


def loaded(url: str, model: str, level: int, tokens: int) -> dict:
    kinds = [("edit", "chat")[i % 2] for i in range(level)]
    before = spec_counts(url)
    start = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        done = list(pool.map(lambda k: stream(url, k, tokens, model), kinds))
    wall = time.perf_counter() - start
    steps, drafted, accepted = (a - b for a, b in zip(spec_counts(url), before, strict=False))
    return {"tok_s": sum(d["tokens"] for d in done) / wall, "drafted": drafted,
            "accepted": accepted, "steps": steps}


def llmctl_arms(target: str, draft: str, threads: int) -> dict:
    base = [target, "--threads", str(threads), "--max-num-seqs", str(SLOTS),
            "--ctx-size", str(CTX_PER_SEQ), "--flash-attn", "on"]
    return {"llmctl none": base, "llmctl ngram": [*base, "--spec", "ngram"],
            "llmctl draft": [*base, "--draft", draft]}


def peer_arms(exe: Path, target: str, draft: str, threads: int) -> dict:
    base = [str(exe), "-m", str(resolve_model(target).path), "-np", "1", "-c", str(CTX_PER_SEQ),
            "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1", "--no-webui",
            "--jinja", "-fa", "on"]
    return {"llama-server none": base,
            "llama-server ngram": [*base, "--spec-type", "ngram-simple"],
            "llama-server draft": [*base, "-md", str(resolve_model(draft).path),
                                   "--spec-draft-n-max", "8", "--spec-draft-p-min", "0.75"]}


def run(args) -> dict:
    results: dict[str, dict] = {}
    for name, argv in llmctl_arms(args.target, args.draft, args.threads).items():
        print(f"== {name}", file=sys.stderr, flush=True)
        with Server.llmctl_serve(*argv) as srv:
            results[name] = {"single": single(srv.url, args.target, args.tokens, True),
                             "loaded": {c: loaded(srv.url, args.target, c, args.tokens)
                                        for c in args.levels}}
    if args.llama_server is not None:
        for name, argv in peer_arms(args.llama_server, args.target, args.draft, args.threads).items():
            print(f"== {name}", file=sys.stderr, flush=True)
            with Server(argv, name="llama-server") as srv:
                results[name] = {"single": single(srv.url, args.target, args.tokens, False)}
    return results


def report(results: dict, levels: list[int]) -> None:
    ref = results["llmctl none"]["single"]
    print(f"\n{'single stream (decode tok/s)':30}{'edit':>10}{'chat':>10}{'accept edit':>13}"
          f"{'accept chat':>13}  identical to llmctl none")
    for name, r in results.items():
        s = r["single"]
        cells = "".join(f"{s[k]['decode_tok_s']:>10.2f}" for k in PROMPTS)
        acc = "".join(f"{_rate(s[k]):>13}" for k in PROMPTS)
        same = all(s[k]["text"] == ref[k]["text"] for k in PROMPTS)
        print(f"{name:30}{cells}{acc}  {same}")
    for mode in ("ngram", "draft"):
        for k in PROMPTS:
            ours = results[f"llmctl {mode}"]["single"][k]["decode_tok_s"]
            line = f"{mode} {k}: x{ours / ref[k]['decode_tok_s']:.2f} of no speculation"
            peer = results.get(f"llama-server {mode}")
            if peer:
                line += f", x{ours / peer['single'][k]['decode_tok_s']:.2f} of llama-server's {mode}"
            print(line)
    for c in levels:
        off = results["llmctl none"]["loaded"][c]["tok_s"]
        for mode in ("none", "ngram", "draft"):
            r = results[f"llmctl {mode}"]["loaded"][c]
            print(f"c={c:<3} llmctl {mode:6} {r['tok_s']:7.2f} tok/s  x{r['tok_s'] / off:.2f} of "
                  f"none  accepted {_rate(r)}")


def _rate(r: dict) -> str:
    if not r.get("drafted"):
        return "-"
    return f"{r['accepted'] / r['drafted']:.0%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="8,16")
    ap.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    args.levels = [int(x) for x in args.levels.split(",") if x]
    if args.skip_peers or not args.llama_server.exists():
        args.llama_server = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    results = run(args)
    if args.json:
        print(json.dumps(results, indent=1))
    else:
        report(results, args.levels)


if __name__ == "__main__":
    main()
