#!/usr/bin/env python3
"""Bursts, side by side: `llmctl serve` against llama-server (-np 16, the
same threads and context per slot) on one model, in one run.

Three arms, each on servers started for it:
  burst    --burst short chat requests (32-token prompts, --output-tokens
           out, greedy) sent at once to each server in turn, through
           `llmctl bench --burst --chat`: errors, requests/s, output tok/s,
           TTFT and end-to-end percentiles, and llmctl / llama-server. With
           --sweep, each server first runs 1, 2, 4, ... up to the burst
           (the throughput-latency curve; --plot draws both).
  queue    --queue-requests one-token chats sent at once to llmctl over raw
           connections: their statuses, the server's RSS before and at its
           peak, the deepest queue /metrics showed, and the growth per
           queued request against what the byte budget charges for one.
  attacks  the burst again against llmctl, with bench/attacks.py's catalogue
           sent one a second beside it and /health polled every 100 ms: the
           healthy requests' errors, the attacks' statuses, /health p50/p95.
           An attack that is a valid request (a clamped repeat_last_n, say)
           waits its turn behind the burst like any other, so each may take
           as long as the burst does; the longest wait per attack is shown.

    .venv/bin/python scripts/bench_burst.py [--model smollm2] [--burst 1000]
        [--output-tokens 32] [--queue-requests 10000] [--arms burst,queue,attacks]
        [--sweep] [--plot out.png] [--json out.json]

llama-server is looked for at $LLAMA_SERVER or /tmp/llama-server-build/bin/
(scripts/build_llama_server.sh). Run it alone on the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import Counter
from itertools import cycle
from pathlib import Path

import httpx
from rich.console import Console

from llmctl.bench.api import bench
from llmctl.bench.attacks import catalogue, send
from llmctl.bench.launcher import Server, http_ok
from llmctl.bench.report import run_table
from llmctl.runtime.system import default_threads
from llmctl.server.admission import PER_REQUEST_BYTES
from llmctl.store.resolve import resolve_model

CTX_PER_SEQ = 512
SLOTS = 16
PROMPT_TOKENS = 32
MB = 1 << 20
BURST_HORIZON_S = 1800.0


def llmctl_server(model: str, threads: int) -> Server:
    return Server.llmctl_serve(model, "--max-num-seqs", str(SLOTS), "--ctx-size",
                               str(CTX_PER_SEQ), "--threads", str(threads))


def llama_server(model: str, threads: int, binary: Path) -> Server:
    path = str(resolve_model(model).path)
    return Server([str(binary), "-m", path, "-np", str(SLOTS), "-c", str(SLOTS * CTX_PER_SEQ),
                   "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1"],
                  ready=http_ok("/health"))


def _burst_run(srv: Server, args, slo: float | None) -> dict:
    return bench(url=srv.url + "/v1", burst=args.burst, chat=True, requests=64,
                 input_tokens=PROMPT_TOKENS, output_tokens=args.output_tokens,
                 slo_ttft=slo, timeout=3600)


def burst_arm(args) -> dict:
    """The burst (and with --sweep, the curve up to it) on each server."""
    servers = {"llmctl serve": lambda: llmctl_server(args.model, args.threads)}
    if args.llama_server.exists():
        servers["llama-server -np 16"] = lambda: llama_server(args.model, args.threads,
                                                               args.llama_server)
    runs = {}
    for name, make in servers.items():
        with make() as srv:
            runs[name] = _burst_run(srv, args, 1.0 if args.sweep else None)
        print(f"\n{name}", flush=True)
        Console(width=100).print(run_table(runs[name]))
    out = {name: _last(run) for name, run in runs.items()}
    if len(out) == 2:
        ours, theirs = out.values()
        out["ratio"] = {k: ours[k] / theirs[k] for k in ("requests_per_s", "output_tokens_per_s",
                                                          "ttft_p50", "e2e_p50")
                        if ours[k] and theirs[k]}
    if args.plot:
        plot(runs, args.plot)
    return {"levels": {name: run["levels"] for name, run in runs.items()}, "burst": out}


def _last(run: dict) -> dict:
    lv = run["levels"][-1]
    return {"requests": lv["requests"], "errors": lv["errors"],
            "error_messages": lv["error_messages"], "requests_per_s": lv["requests_per_s"],
            "output_tokens_per_s": lv["output_tokens_per_s"], "ttft_p50": lv["ttft"]["p50"],
            "ttft_p95": lv["ttft"]["p95"], "e2e_p50": lv["e2e"]["p50"],
            "e2e_p95": lv["e2e"]["p95"], "best_under_slo": run.get("best_under_slo")}


def plot(runs: dict[str, dict], path: Path) -> None:
    """Throughput against TTFT p95 for every server, one curve each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for (name, run), color in zip(runs.items(), ("#2f9e44", "#1c7ed6"), strict=False):
        levels = [lv for lv in run["levels"] if lv["ok"]]
        xs, ys = [lv["ttft"]["p95"] for lv in levels], [lv["requests_per_s"] for lv in levels]
        ax.plot(xs, ys, "o-", color=color, label=name, markersize=4)
        for lv, x, y in zip(levels, xs, ys, strict=False):
            ax.annotate(str(lv["concurrency"]), (x, y), xytext=(4, 4), fontsize=7,
                        textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("TTFT p95 (s)   labels: concurrency", fontsize=9)
    ax.set_ylabel("throughput (requests/s)", fontsize=9)
    ax.set_ylim(bottom=0)
    ax.grid(True, color="#e9ecef")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


async def _raw_chat(port: int, body: bytes, statuses: Counter) -> None:
    """One request on its own connection, read to the end; its status counted."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=1 << 20)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nConnection: close\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        await writer.drain()
        head = await asyncio.wait_for(reader.readline(), 3600)
        await reader.read()
        writer.close()
        statuses[head.split()[1].decode() if head.startswith(b"HTTP/") else "no-status"] += 1
    except (OSError, asyncio.TimeoutError) as e:
        statuses[type(e).__name__] += 1


async def _watch_queue(srv: Server, seen: dict, stop: asyncio.Event) -> None:
    """RSS and queue depth, every 250 ms, until `stop`."""
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            seen["rss_peak"] = max(seen["rss_peak"], srv.rss())
            text = (await http.get(srv.url + "/metrics")).text
            for line in text.splitlines():
                if line.startswith(("llmctl_queue_requests ", "llmctl_queue_bytes ")):
                    name, value = line.split()
                    seen[name] = max(seen.get(name, 0), int(float(value)))
            await asyncio.sleep(0.25)


def queue_arm(args) -> dict:
    """--queue-requests one-token chats at once against llmctl."""
    with llmctl_server(args.model, args.threads) as srv:
        httpx.post(srv.url + "/v1/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "warm up"}], "max_tokens": 1})
        base = srv.rss()
        seen = {"rss_peak": base}

        async def run() -> tuple[Counter, float]:
            statuses: Counter = Counter()
            stop = asyncio.Event()
            watcher = asyncio.create_task(_watch_queue(srv, seen, stop))
            start = time.perf_counter()
            await asyncio.gather(*(_raw_chat(srv.port, json.dumps({
                "model": args.model, "max_tokens": 1, "temperature": 0,
                "messages": [{"role": "user", "content": f"Say the number {i}"}]}).encode(),
                statuses) for i in range(args.queue_requests)))
            stop.set()
            await watcher
            return statuses, time.perf_counter() - start

        statuses, took = asyncio.run(run())
    depth = seen.get("llmctl_queue_requests", 0)
    growth = seen["rss_peak"] - base
    return {"requests": args.queue_requests, "statuses": dict(statuses), "seconds": took,
            "rss_base_mb": base / MB, "rss_growth_mb": growth / MB,
            "queue_depth_peak": depth, "queued_bytes_peak_mb": seen.get("llmctl_queue_bytes", 0) / MB,
            "growth_per_queued_kib": growth / depth / 1024 if depth else None,
            "charge_per_request_kib": PER_REQUEST_BYTES / 1024}


async def _health_loop(url: str, times: list[float], bad: Counter, stop: asyncio.Event) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        while not stop.is_set():
            start = time.perf_counter()
            try:
                r = await http.get(url + "/health")
                times.append(time.perf_counter() - start)
                if r.status_code != 200:
                    bad[str(r.status_code)] += 1
            except httpx.HTTPError as e:
                bad[type(e).__name__] += 1
            await asyncio.sleep(0.1)


async def _attack_loop(url: str, model: str, seen: dict, stop: asyncio.Event) -> None:
    tasks = []

    async def one(http: httpx.AsyncClient, attack) -> None:
        start = time.perf_counter()
        status = await send(http, url, attack, timeout_s=BURST_HORIZON_S)
        seen.setdefault(attack.name, Counter())[status] += 1
        waits = seen.setdefault("longest wait (s)", {})
        waits[attack.name] = max(waits.get(attack.name, 0.0), round(time.perf_counter() - start, 1))

    async with httpx.AsyncClient() as http:
        for attack in cycle(catalogue(model)):
            if stop.is_set():
                break
            tasks.append(asyncio.create_task(one(http, attack)))
            await asyncio.sleep(1.0)
        await asyncio.gather(*tasks)


def attacks_arm(args) -> dict:
    """The burst against llmctl with the attacks and a /health poller beside it."""
    with llmctl_server(args.model, args.threads) as srv:
        times: list[float] = []
        bad: Counter = Counter()
        seen: dict = {}

        async def side(stop: asyncio.Event) -> None:
            await asyncio.gather(_health_loop(srv.url, times, bad, stop),
                                 _attack_loop(srv.url, args.model, seen, stop))

        def run() -> dict:
            async def both() -> dict:
                stop = asyncio.Event()
                sides = asyncio.create_task(side(stop))
                try:
                    return await asyncio.to_thread(_burst_run, srv, args, None)
                finally:
                    stop.set()
                    await sides
            return asyncio.run(both())

        result = _last(run())
    q = statistics.quantiles(times, n=100) if len(times) > 1 else [0.0] * 99
    waits = seen.pop("longest wait (s)", {})
    failing = {n: dict(c) for n, c in seen.items()
               if any(s.startswith(("5", "client")) or s == "timeout" for s in c)}
    return {"healthy": result, "health_p50_ms": q[49] * 1000, "health_p95_ms": q[94] * 1000,
            "health_checks": len(times), "health_not_ok": dict(bad),
            "attacks": {n: dict(c) for n, c in sorted(seen.items())}, "attacks_failing": failing,
            "attack_longest_wait_s": waits}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--queue-requests", type=int, default=10_000)
    ap.add_argument("--arms", default="burst,queue,attacks")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--sweep", action="store_true", help="The curve up to the burst too.")
    ap.add_argument("--plot", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--llama-server", type=Path, default=Path(os.environ.get(
        "LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    args = ap.parse_args()
    arms = {"burst": burst_arm, "queue": queue_arm, "attacks": attacks_arm}
    results = {}
    for name in args.arms.split(","):
        print(f"== {name} ({args.model})", flush=True)
        results[name] = arms[name](args)
        print(json.dumps({k: v for k, v in results[name].items() if k != "levels"}, indent=1),
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"settings": {k: str(v) for k, v in vars(args).items()},
                                         "results": results}, indent=1))


if __name__ == "__main__":
    main()
