#!/usr/bin/env python3
"""`llmctl cluster` benchmark, side by side in one run.

A multi-tenant workload: 8 tenants, each with its own ~800-token system
prompt, 64 streamed chat requests (8 per tenant, in a shuffled order) at
concurrency 16, 32 generated tokens each. Three arms, each on a fresh
deployment with its own fresh cache dir, so no arm inherits another's
prefix cache (memory or disk):

  affinity  2 replicas x 1 thread, llmctl's prefix-affinity router
  default   2 replicas x 1 thread, Ray Serve's power-of-two-choices router
  single    1 replica x 2 threads (for scale)

Reported per arm: TTFT p50/p90 (to the first content token), output tok/s
(generated tokens / wall time), and the prefix-cache hit tokens (memory,
disk) from /cluster/stats; then affinity/default ratios (targets: TTFT p50
<= 0.6x, tok/s >= 1.2x). One local Ray cluster serves all arms.

Usage: .venv/bin/python scripts/bench_cluster.py [--model smollm2] [--rounds 1] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

WORDS = ("river stone lamp garden window copper forest signal harbor violet engine "
         "meadow silver thunder candle orbit marble whisper lantern canyon").split()
TENANTS, PER_TENANT, CONCURRENCY, MAX_TOKENS = 8, 8, 16, 32


def system_prompt(tenant: int, n_words: int = 780) -> str:
    rnd = random.Random(tenant)
    return f"You are the assistant of tenant {tenant}. Policy: " + \
        " ".join(rnd.choice(WORDS) for _ in range(n_words))


def workload(rounds: int) -> list[dict]:
    order = [(t, q) for t in range(TENANTS) for q in range(PER_TENANT * rounds)]
    random.Random(0).shuffle(order)
    return [{"model": "bench", "stream": True, "max_tokens": MAX_TOKENS, "temperature": 0,
             "ignore_eos": True,
             "messages": [{"role": "system", "content": system_prompt(t)},
                          {"role": "user", "content": f"Question {q}: what is rule {q}?"}]}
            for t, q in order]


async def one(client: httpx.AsyncClient, body: dict) -> tuple[float, int, int]:
    """(TTFT seconds, generated tokens, prompt tokens) of one streamed request."""
    start, ttft, tokens, prompt = time.perf_counter(), None, 0, 0
    async with client.stream("POST", "/v1/chat/completions",
                             json={**body, "stream_options": {"include_usage": True}}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens, prompt = chunk["usage"]["completion_tokens"], chunk["usage"]["prompt_tokens"]
            if ttft is None and any(c["delta"].get("content") for c in chunk.get("choices", [])):
                ttft = time.perf_counter() - start
    return ttft if ttft is not None else time.perf_counter() - start, tokens, prompt


async def run_workload(url: str, bodies: list[dict]) -> dict:
    gate = asyncio.Semaphore(CONCURRENCY)

    async def gated(client, body):
        async with gate:
            return await one(client, body)

    async with httpx.AsyncClient(base_url=url, timeout=600) as client:
        start = time.perf_counter()
        results = await asyncio.gather(*(gated(client, b) for b in bodies))
        wall = time.perf_counter() - start
        stats = (await client.get("/cluster/stats")).json()
    ttfts = sorted(r[0] for r in results)
    replicas = stats["replicas"].values()
    return {"requests": len(results), "wall_s": round(wall, 2),
            "prompt_tokens_mean": round(statistics.mean(r[2] for r in results)),
            "ttft_p50_s": round(statistics.median(ttfts), 3),
            "ttft_p90_s": round(ttfts[int(0.9 * (len(ttfts) - 1))], 3),
            "tok_s": round(sum(r[1] for r in results) / wall, 1),
            "hit_tokens_memory": sum(r["prefix_cache_hit_tokens_memory"] for r in replicas),
            "hit_tokens_disk": sum(r["prefix_cache_hit_tokens_disk"] for r in replicas),
            "prompt_tokens": sum(r["prompt_tokens"] for r in replicas),
            "routing": stats["routing"]}


def arm(args, name: str, replicas: int, threads: int, router: str, port: int) -> dict:
    from llmctl.cluster.deploy import ClusterSettings, deploy, undeploy
    from llmctl.cluster.replica import ReplicaSpec
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.store.resolve import resolve_model

    resolved = resolve_model(args.model)
    slots = CONCURRENCY // replicas
    spec = ReplicaSpec(resolved, LoadOptions(ctx_size=2048, threads=threads, max_num_seqs=slots),
                       cache_dir=tempfile.mkdtemp(prefix=f"bench-cluster-{name}-"), port=port)
    deploy(spec, ClusterSettings(replicas=replicas, router=router))
    bodies = [{**b, "model": resolved.name} for b in workload(args.rounds)]
    try:
        time.sleep(2)   # the replicas' first reports reach the board
        result = asyncio.run(run_workload(f"http://127.0.0.1:{port}", bodies))
    finally:
        undeploy()
    sizes = [p.stat().st_size for p in Path(spec.cache_dir).glob("prefix/*/*.kv")]
    # What the shared storage holds and serves: one state per distinct prefix.
    result |= {"disk_states": len(sizes), "disk_state_mb_mean": round(statistics.mean(sizes) / 1e6, 2)
               if sizes else 0.0}
    print(f"{name:9s} {replicas}x{threads}t  TTFT p50 {result['ttft_p50_s']:.3f}s  "
          f"p90 {result['ttft_p90_s']:.3f}s  {result['tok_s']:.1f} tok/s  hits: "
          f"{result['hit_tokens_memory']} mem + {result['hit_tokens_disk']} disk of "
          f"{result['prompt_tokens']} prompt tokens", file=sys.stderr, flush=True)
    return {"arm": name, "replicas": replicas, "threads": threads, "router": router, **result}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--rounds", type=int, default=1, help="repeat the 64 requests per arm")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from llmctl.cluster.deploy import connect, stop

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    connect(num_cpus=2, object_store_mb=256)
    try:
        rows = [arm(args, "affinity", 2, 1, "affinity", port),
                arm(args, "default", 2, 1, "default", port),
                arm(args, "single", 1, 2, "default", port)]
    finally:
        stop()
    aff, dft = rows[0], rows[1]
    ratios = {"ttft_p50_affinity_over_default": round(aff["ttft_p50_s"] / dft["ttft_p50_s"], 3),
              "tok_s_affinity_over_default": round(aff["tok_s"] / dft["tok_s"], 3)}
    print(f"affinity/default: TTFT p50 {ratios['ttft_p50_affinity_over_default']}x (target <= 0.6), "
          f"tok/s {ratios['tok_s_affinity_over_default']}x (target >= 1.2)", file=sys.stderr)
    if args.json:
        print(json.dumps({"model": args.model, "rows": rows, **ratios}, indent=2))


if __name__ == "__main__":
    main()
