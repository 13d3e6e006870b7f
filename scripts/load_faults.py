#!/usr/bin/env python3
"""Fault load, side by side in one run: `llmctl serve` and llama.cpp's
llama-server under clients that hang up and bodies that are wrong.

Both serve the bundled SmolLM2 with 16 slots of 512 tokens and the same
threads, one after the other, each with the whole machine. Per server:

1. warm-up: 20 healthy requests;
2. no-fault phase: the 21 healthy clients only (--nofault-requests);
3. fault phase (--requests, split evenly over 32 clients, 16 streaming and
   16 not): 11 clients hang up (streams after 3 chunks, the others after a
   0.7 s client timeout, asking for 384 tokens so generation is still
   running), spread over the phase; the rest ask for --max-tokens with
   ignore_eos at temperature 0 (streams with include_usage). Interleaved:
   --bad-rounds x 8 malformed bodies (invalid JSON, wrong types, NaN,
   content not a string) and 10 MB prompts;
4. drain: after the last client finishes, the in-flight gauge is polled
   every 50 ms until it reads 0 (llmctl: /stats requests_running + waiting;
   llama-server, started with --metrics: requests_processing + deferred).

Reported: 5xx by request kind (target 0), time to drain (0 within 1 s),
healthy requests completed and how many got exactly --max-tokens tokens by
usage (all), server RSS growth over the fault phase (< 50 MB) and healthy
tok/s in the fault phase over the no-fault phase (>= 0.9).

    .venv/bin/python scripts/load_faults.py [--requests 500] [--threads 2] \\
        [--llama-server PATH | --skip-llama-server] [--json out.json]

Everything stays on 127.0.0.1; each request has a timeout and the whole run
has --deadline seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path

import httpx

from llmctl.bench.launcher import Server, http_ok
from llmctl.bench.load_clients import CLIENTS, Tally, run_phase
from llmctl.store.resolve import resolve_model

SLOTS = 16
CTX_PER_SEQ = 512
WARMUP_REQUESTS = 20
REQUEST_TIMEOUT_S = 120.0
DRAIN_POLL_S = 0.05
DRAIN_LIMIT_S = 30.0
MB = 1024 * 1024

Gauge = Callable[[httpx.AsyncClient, str], Awaitable[int]]


async def llmctl_in_flight(http: httpx.AsyncClient, base: str) -> int:
    stats = (await http.get(base + "/stats", timeout=5.0)).json()
    return stats["requests_running"] + stats["requests_waiting"]


async def llama_server_in_flight(http: httpx.AsyncClient, base: str) -> int:
    text = (await http.get(base + "/metrics", timeout=5.0)).text
    names = ("llamacpp:requests_processing", "llamacpp:requests_deferred")
    values = [float(line.split()[1]) for line in text.splitlines()
              if line.split(" ", 1)[0] in names]
    if len(values) != len(names):
        raise RuntimeError("llama-server /metrics lacks the request gauges")
    return int(sum(values))


def servers(threads: int, llama_server: Path,
            skip: bool) -> dict[str, tuple[Callable[[], Server], Gauge]]:
    """Each server to load, as a factory (a port is picked at start) and the
    gauge of its requests in flight."""
    out = {"llmctl serve": (partial(Server.llmctl_serve, "smollm2", "--max-num-seqs", str(SLOTS),
                                    "--ctx-size", str(CTX_PER_SEQ), "--threads", str(threads)),
                            llmctl_in_flight)}
    if not skip and llama_server.exists():
        model = str(resolve_model("smollm2").path)
        out["llama-server"] = (partial(
            Server, [str(llama_server), "-m", model, "-np", str(SLOTS),
                     "-c", str(SLOTS * CTX_PER_SEQ), "-t", str(threads), "-tb", str(threads),
                     "--metrics", "--host", "127.0.0.1"], ready=http_ok("/health")),
            llama_server_in_flight)
    elif not skip:
        print(f"{llama_server} not found: llama-server skipped", flush=True)
    return out


async def drain(http: httpx.AsyncClient, base: str, gauge: Gauge) -> dict:
    """Poll GAUGE every 50 ms until it reads 0: its first reading and the
    seconds it took (None past DRAIN_LIMIT_S)."""
    start = time.perf_counter()
    first = None
    while time.perf_counter() - start < DRAIN_LIMIT_S:
        value = await gauge(http, base)
        first = value if first is None else first
        if value == 0:
            return {"in_flight_at_end": first, "drain_s": time.perf_counter() - start}
        await asyncio.sleep(DRAIN_POLL_S)
    return {"in_flight_at_end": first, "drain_s": None}


def phase_summary(tally: Tally, tok_s: float) -> dict:
    return {"tok_s": tok_s, "healthy_done": tally.healthy_done,
            "exact_max_tokens": tally.exact_tokens, "usage_missing": tally.usage_missing,
            "statuses": {k: dict(v) for k, v in sorted(tally.statuses.items())},
            "5xx_by_kind": tally.count_5xx(), "5xx_samples": tally.server_errors}


async def measure(srv: Server, gauge: Gauge, args: argparse.Namespace) -> dict:
    """Warm-up, no-fault phase, fault phase and drain against SRV."""
    limits = httpx.Limits(max_connections=2 * CLIENTS, max_keepalive_connections=2 * CLIENTS)
    async with httpx.AsyncClient(limits=limits,
                                 timeout=httpx.Timeout(REQUEST_TIMEOUT_S, connect=10.0)) as http:
        model = (await http.get(srv.url + "/v1/models")).json()["data"][0]["id"]
        phase = partial(run_phase, http, srv.url, model, max_tokens=args.max_tokens)
        await phase(WARMUP_REQUESTS, faults=False)
        nofault = phase_summary(*await phase(args.nofault_requests, faults=False))
        rss_start = srv.rss()
        fault = phase_summary(*await phase(args.requests, faults=True,
                                           bad_rounds=args.bad_rounds))
        drained = await drain(http, srv.url, gauge)
        rss_end = srv.rss()
    return {"nofault": nofault, "fault": fault, **drained,
            "rss_start_mb": rss_start / MB, "rss_growth_mb": (rss_end - rss_start) / MB,
            "tok_s_ratio": fault["tok_s"] / nofault["tok_s"] if nofault["tok_s"] else None}


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def table(results: dict[str, dict], args: argparse.Namespace) -> None:
    """The side-by-side table, with the issue's target per row."""
    rows = [
        ("5xx in the fault phase", lambda r: sum(r["fault"]["5xx_by_kind"].values()), "0"),
        ("in flight when clients done", lambda r: r["in_flight_at_end"], ""),
        ("seconds until 0 in flight", lambda r: r["drain_s"], "<= 1"),
        ("healthy completed (fault)", lambda r: r["fault"]["healthy_done"], ""),
        (f"  with exactly {args.max_tokens} tokens", lambda r: r["fault"]["exact_max_tokens"],
         "all"),
        ("  without usage (chunks counted)", lambda r: r["fault"]["usage_missing"], "0"),
        ("RSS before fault phase (MB)", lambda r: r["rss_start_mb"], ""),
        ("RSS growth (MB)", lambda r: r["rss_growth_mb"], "< 50"),
        ("healthy tok/s, no faults", lambda r: r["nofault"]["tok_s"], ""),
        ("healthy tok/s, fault phase", lambda r: r["fault"]["tok_s"], ""),
        ("fault / no-fault tok/s", lambda r: r["tok_s_ratio"], ">= 0.9"),
    ]
    names = list(results)
    print(f"\n{'':34}" + "".join(f"{n:>16}" for n in names) + f"{'target':>10}")
    for label, get, target in rows:
        cells = "".join(f"{_fmt(get(results[n]) if 'error' not in results[n] else None):>16}"
                        for n in names)
        print(f"{label:34}{cells}{target:>10}")
    for name, r in results.items():
        if "error" in r:
            print(f"{name}: {r['error']}")
            continue
        for kind, n in r["fault"]["5xx_by_kind"].items():
            print(f"{name}: {n} x 5xx from {kind}")
        for sample in r["fault"]["5xx_samples"]:
            print(f"{name}: sample {json.dumps(sample)}")
        bad = {k: v for k, v in r["fault"]["statuses"].items() if k.startswith("bad:")}
        print(f"{name}: bad bodies -> {json.dumps(bad)}")
    if len(names) == 2 and all("error" not in results[n] for n in names):
        a, b = (results[n] for n in names)
        for phase in ("nofault", "fault"):
            print(f"{names[0]} / {names[1]} healthy tok/s, {phase}: "
                  f"x{a[phase]['tok_s'] / b[phase]['tok_s']:.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=500, help="Fault-phase requests.")
    ap.add_argument("--nofault-requests", type=int, default=160)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--bad-rounds", type=int, default=4,
                    help="Rounds of the 8 malformed/oversized bodies in the fault phase.")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--skip-llama-server", action="store_true")
    ap.add_argument("--deadline", type=float, default=3600.0,
                    help="Seconds for all the loads together; a server still under load past it "
                         "is cut off (each start-up has its own 300 s limit).")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    deadline = time.monotonic() + args.deadline
    results: dict[str, dict] = {}
    for name, (factory, gauge) in servers(args.threads, args.llama_server,
                                          args.skip_llama_server).items():
        print(f"== {name}", flush=True)
        with factory() as srv:
            try:
                results[name] = asyncio.run(asyncio.wait_for(
                    measure(srv, gauge, args), max(1.0, deadline - time.monotonic())))
            except asyncio.TimeoutError:
                results[name] = {"error": f"cut off by --deadline {args.deadline:.0f}s"}
        print(json.dumps(results[name]), flush=True)
    table(results, args)
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {
            "llama_server": str(args.llama_server), "json": str(args.json)},
            "results": results}, indent=2))


if __name__ == "__main__":
    main()
