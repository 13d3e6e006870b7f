#!/usr/bin/env python3
"""Where an engine step's time goes on a small model: the share
spent inside llama_decode against the Python around it (scheduling, batch
building, sampling, detokenizing, hand-offs), in process at concurrency 16;
then, through `llmctl serve` under the same load, the CPU time of each OS
thread, to show what the HTTP event loop costs beside the engine.

    .venv/bin/python scripts/profile_step.py [--model smollm2] [--requests 48]
        [--tokens 128] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from llmctl.bench.launcher import Server
from llmctl.runtime import llama
from llmctl.runtime.engine import loop as engine
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams

CONCURRENCY = 16


def _timed(owner, name: str, totals: dict) -> None:
    """Wrap owner.name to add its wall time and calls to totals[name]."""
    inner = getattr(owner, name)

    def wrapper(*a, **kw):
        t = time.perf_counter()
        try:
            return inner(*a, **kw)
        finally:
            slot = totals.setdefault(name, [0.0, 0])
            slot[0] += time.perf_counter() - t
            slot[1] += 1
    setattr(owner, name, wrapper)


def graph_runs(items: list[tuple[int, list[int], int, int]], n_ubatch: int = 512) -> int:
    """How many graph runs llama.cpp makes of one decode call with a KV
    stream per sequence: its split_equal(sequential) takes a run of
    consecutive sequence ids with tokens left and the same number of tokens
    from each, until every token is used."""
    left = dict(sorted((seq, len(tokens)) for seq, tokens, _, _ in items))
    runs = 0
    while any(left.values()):
        chain: list[int] = []
        for seq, n in left.items():
            if n and (not chain or seq == chain[-1] + 1):
                chain.append(seq)
        take = max(1, min(min(left[s] for s in chain), n_ubatch // len(chain)))
        for seq in chain:
            left[seq] -= min(take, left[seq])
        runs += 1
    return runs


def _count_decodes(counts: dict) -> None:
    """Wrap LlamaContext.decode to add each call's rows, graph runs and
    the call itself to counts["rows"], ["graphs"] and ["calls"]."""
    inner = llama.LlamaContext.decode

    def decode(self, items):
        counts["rows"] = counts.get("rows", 0) + sum(len(item[1]) for item in items)
        counts["graphs"] = counts.get("graphs", 0) + graph_runs(items)
        counts["calls"] = counts.get("calls", 0) + 1
        return inner(self, items)
    llama.LlamaContext.decode = decode


def in_process(args) -> dict:
    totals: dict[str, list] = {}
    for owner, name in ((engine.Engine, "_step"), (llama.LlamaContext, "decode"),
                        (llama.Sampler, "sample"), (engine.Engine, "_accept")):
        _timed(owner, name, totals)
    opts = LoadOptions(threads=args.threads, max_num_seqs=CONCURRENCY)
    with LLM.load(args.model, opts) as llm:
        prompts = [llm.chat_tokens([{"role": "user", "content": f"Write note {i} about the sea."}])
                   for i in range(args.requests)]
        params = SamplingParams(temperature=0.7, seed=1, max_tokens=args.tokens, ignore_eos=True)
        llm.complete(prompts[0], SamplingParams(max_tokens=4))
        totals.clear()
        start = time.perf_counter()
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            done = list(pool.map(lambda p: llm.complete(p, params), prompts))
        wall = time.perf_counter() - start
    step_s, steps = totals["_step"]
    decode_s = totals["decode"][0]
    return {"tok_s": sum(c.usage.completion_tokens for c in done) / wall, "steps": steps,
            "step_ms": 1e3 * step_s / steps, "decode_ms": 1e3 * decode_s / steps,
            "python_share": (step_s - decode_s) / step_s,
            "sample_ms_per_token": 1e3 * totals["sample"][0] / totals["sample"][1],
            "accept_ms_per_token": 1e3 * totals["_accept"][0] / totals["_accept"][1]}


def _thread_cpu(pid: int) -> dict[int, int]:
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[int(tid)] = int(fields[11]) + int(fields[12])     # utime + stime
        except OSError:
            pass
    return out


def _chat(url: str, model: str, i: int, tokens: int) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": f"Write note {i} about the sea."}],
            "max_tokens": tokens, "temperature": 0.7, "seed": 1, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=900) as r:
        r.raise_for_status()
        for _ in r.iter_lines():
            pass


def through_server(args) -> dict:
    with Server.llmctl_serve(args.model, "--threads", str(args.threads),
                             "--max-num-seqs", str(CONCURRENCY)) as srv:
        _chat(srv.url, args.model, 0, 4)
        pid = srv._proc.pid
        before = _thread_cpu(pid)
        with ThreadPoolExecutor(CONCURRENCY) as pool:
            list(pool.map(lambda i: _chat(srv.url, args.model, i, args.tokens), range(args.requests)))
        after = _thread_cpu(pid)
    used = {tid: after[tid] - before.get(tid, 0) for tid in after}
    total = sum(used.values()) or 1
    busiest = sorted(used.values(), reverse=True)
    return {"event_loop_share": used.get(pid, 0) / total,
            "top_two_threads_share": sum(busiest[:2]) / total, "cpu_s": total / os.sysconf("SC_CLK_TCK")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    result = {"in_process": in_process(args), "server": through_server(args)}
    if args.json:
        print(json.dumps(result, indent=1))
        return
    p, s = result["in_process"], result["server"]
    print(f"in process, c={CONCURRENCY}: {p['tok_s']:.1f} tok/s, {p['steps']} steps of "
          f"{p['step_ms']:.2f} ms, {p['decode_ms']:.2f} ms of it in llama_decode: Python is "
          f"{p['python_share']:.1%} of a step (sampling {p['sample_ms_per_token']:.3f} ms and "
          f"detokenize/stop/emit {p['accept_ms_per_token']:.3f} ms per token)")
    print(f"llmctl serve, c={CONCURRENCY}: the HTTP event loop used {s['event_loop_share']:.1%} of "
          f"the process's CPU; the two busiest threads (the engine and ggml's worker) "
          f"{s['top_two_threads_share']:.1%}")


if __name__ == "__main__":
    main()
