#!/usr/bin/env python3
"""A lone prompt's prefill, side by side in one run: llama-server's own
prompt time (`timings.prompt_ms`, no prompt cache) against one
llama_decode of the same tokens in this process, alternating pair by pair,
same model, threads and flash-attention setting, each while the other is
idle. It tells a gap in the library call from one in the server around it.

    .venv/bin/python scripts/bench_prefill.py [--model qwen2.5-coder-0.5b]
        [--tokens 130] [--pairs 12] [--threads 2] [--flash-attn off]

llama-server is looked for at $LLAMA_SERVER or /tmp/llama-server-build/bin/
(scripts/build_llama_server.sh builds it with our CPU flags).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from pathlib import Path

import httpx

from llmctl.bench.launcher import Server, http_ok
from llmctl.runtime import llama
from llmctl.runtime.llama.context import ContextConfig, LlamaContext
from llmctl.runtime.system import default_threads
from llmctl.store.resolve import resolve_model

SLOTS, CTX_PER_SEQ = 16, 512     # bench_serve.py's shape


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=130)
    ap.add_argument("--pairs", type=int, default=12)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--flash-attn", choices=("on", "off"), default="off")
    ap.add_argument("--llama-server", type=Path, default=Path(os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    args = ap.parse_args()
    path = str(resolve_model(args.model).path)
    model = llama.LlamaModel(path)
    ctx = LlamaContext(model, ContextConfig(
        n_ctx_seq=CTX_PER_SEQ, n_seq_max=SLOTS, n_batch=512, n_threads=args.threads,
        flash_attn=args.flash_attn == "on"))
    server = Server([str(args.llama_server), "-m", path, "-np", str(SLOTS),
                     "-c", str(SLOTS * CTX_PER_SEQ), "-t", str(args.threads),
                     "-tb", str(args.threads), "-fa", args.flash_attn, "--host", "127.0.0.1"],
                    ready=http_ok("/health"))
    ours, theirs = [], []
    with server:
        for i in range(args.pairs):
            tokens = [random.randrange(1000, 20000) for _ in range(args.tokens)]
            reply = httpx.post(server.url + "/completion", timeout=600, json={
                "prompt": tokens, "n_predict": 1, "cache_prompt": False, "temperature": 0})
            theirs.append(reply.json()["timings"]["prompt_ms"] / 1000)
            ctx.clear()
            start = time.perf_counter()
            ctx.decode([(0, tokens, 0, 1)])
            ours.append(time.perf_counter() - start)
            print(f"pair {i + 1}: llama-server {theirs[-1]:.3f} s, llmctl's library "
                  f"{ours[-1]:.3f} s", flush=True)
    ctx.close()
    slower = sum(o > t for o, t in zip(ours, theirs, strict=True))
    print(f"\n{args.model}, {args.tokens} tokens, flash attention {args.flash_attn}: "
          f"llama-server {statistics.median(theirs):.3f} s, llmctl's library "
          f"{statistics.median(ours):.3f} s (medians of {args.pairs}); ratio "
          f"x{statistics.median(ours) / statistics.median(theirs):.3f}; "
          f"slower in {slower} of {args.pairs} pairs")


if __name__ == "__main__":
    main()
