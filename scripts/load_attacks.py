#!/usr/bin/env python3
"""Healthy clients beside the attack catalogue (bench/attacks.py), against a
run without the attacks, in one run.

Two arms, each on a freshly started `llmctl serve MODEL` for --minutes:
healthy chat clients only, then the same clients with one attack sent every
second (cycling through the catalogue). Per arm: the healthy requests'
latency p50/p95 and error count, /health's answer time, and the server's
RSS peak over its RSS after warm-up. Targets: p95 <= 2x the quiet arm's,
0 healthy errors, RSS peak < +300 MB, no 5xx and no timeout for any attack.

    .venv/bin/python scripts/load_attacks.py [--minutes 5] [--model smollm2] \\
        [--clients 4] [--max-tokens 16] [--json out.json]

Everything stays on 127.0.0.1; every request has a timeout and each arm
stops by itself after --minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from collections import Counter
from itertools import cycle
from pathlib import Path

import httpx

from llmctl.bench.attacks import catalogue, send
from llmctl.bench.launcher import Server
from llmctl.bench.load_clients import chat_body

HEALTHY_TIMEOUT_S = 120.0
SAMPLE_S = 0.5
MB = 1024 * 1024


def _p(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else values[0]


class Arm:
    """What one arm saw."""

    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.errors: Counter = Counter()
        self.health_s: list[float] = []
        self.health_bad: Counter = Counter()
        self.attacks: dict[str, Counter] = {}
        self.rss_base = self.rss_peak = 0

    def summary(self) -> dict:
        bad_attacks = {name: dict(c) for name, c in self.attacks.items()
                       if any(s.startswith("5") or s == "timeout" or s.startswith("client-error")
                              for s in c)}
        return {"healthy_done": len(self.latencies), "healthy_errors": dict(self.errors),
                "p50_s": _p(self.latencies, 50), "p95_s": _p(self.latencies, 95),
                "health_p95_s": _p(self.health_s, 95), "health_not_ok": dict(self.health_bad),
                "rss_base_mb": self.rss_base / MB,
                "rss_peak_growth_mb": (self.rss_peak - self.rss_base) / MB,
                "attacks": {n: dict(c) for n, c in sorted(self.attacks.items())},
                "attacks_failing": bad_attacks}


async def healthy(http: httpx.AsyncClient, base: str, model: str, index: int, args, arm: Arm,
                  until: float) -> None:
    """One client: requests back to back, streaming every other one."""
    n = 0
    while time.monotonic() < until:
        stream = (n + index) % 2 == 0
        body = chat_body(model, n * 100 + index, args.max_tokens, stream)
        start = time.perf_counter()
        try:
            if stream:
                async with http.stream("POST", base + "/v1/chat/completions", json=body) as r:
                    text = (await r.aread()).decode(errors="replace")
                    ok = r.status_code == 200 and '"error"' not in text and "[DONE]" in text
            else:
                r = await http.post(base + "/v1/chat/completions", json=body)
                ok = r.status_code == 200
            if ok:
                arm.latencies.append(time.perf_counter() - start)
            else:
                arm.errors[f"http-{r.status_code}"] += 1
        except httpx.HTTPError as e:
            arm.errors[type(e).__name__] += 1
        n += 1


async def attacker(http: httpx.AsyncClient, base: str, model: str, arm: Arm,
                   until: float) -> None:
    """One attack a second, each in its own task so none delays the next."""
    tasks = []

    async def one(attack) -> None:
        status = await send(http, base, attack)
        arm.attacks.setdefault(attack.name, Counter())[status] += 1

    for attack in cycle(catalogue(model)):
        if time.monotonic() >= until:
            break
        tasks.append(asyncio.create_task(one(attack)))
        await asyncio.sleep(1.0)
    await asyncio.gather(*tasks)


async def watch(http: httpx.AsyncClient, srv: Server, arm: Arm, until: float) -> None:
    """/health's answer time and the server's RSS, every SAMPLE_S."""
    while time.monotonic() < until:
        arm.rss_peak = max(arm.rss_peak, srv.rss())
        start = time.perf_counter()
        try:
            r = await http.get(srv.url + "/health", timeout=30.0)
            arm.health_s.append(time.perf_counter() - start)
            if r.status_code != 200:
                arm.health_bad[str(r.status_code)] += 1
        except httpx.HTTPError as e:
            arm.health_bad[type(e).__name__] += 1
        await asyncio.sleep(SAMPLE_S)


async def run_arm(srv: Server, args, attacks: bool) -> dict:
    arm = Arm()
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=32)
    async with httpx.AsyncClient(limits=limits, timeout=HEALTHY_TIMEOUT_S) as http:
        model = (await http.get(srv.url + "/v1/models")).json()["data"][0]["id"]
        # The embeddings context and its compute buffer (bounded by
        # runtime/embed.py's LOGITS_BUDGET) are allocated on first large use:
        # one full batch in both arms, so RSS growth counts what the attacks
        # cost, not a feature's one-time set-up.
        await http.post(srv.url + "/v1/embeddings",
                        json={"model": model, "input": ["word " * 900] * 2})
        warm_until = time.monotonic() + 10
        await asyncio.gather(*(healthy(http, srv.url, model, i, args, Arm(), warm_until)
                               for i in range(args.clients)))
        arm.rss_base = arm.rss_peak = srv.rss()
        until = time.monotonic() + args.minutes * 60
        tasks = [healthy(http, srv.url, model, i, args, arm, until) for i in range(args.clients)]
        tasks.append(watch(http, srv, arm, until))
        if attacks:
            tasks.append(attacker(http, srv.url, model, arm, until))
        await asyncio.gather(*tasks)
    return arm.summary()


def report(results: dict[str, dict]) -> None:
    quiet, loud = results["quiet"], results["attacks"]
    ratio = (loud["p95_s"] / quiet["p95_s"]) if quiet["p95_s"] and loud["p95_s"] else None
    rows = [("healthy requests done", "healthy_done", ""),
            ("healthy errors", lambda r: sum(r["healthy_errors"].values()), "0"),
            ("healthy p50 latency (s)", "p50_s", ""),
            ("healthy p95 latency (s)", "p95_s", ""),
            ("/health p95 (s)", "health_p95_s", ""),
            ("/health not ok", lambda r: sum(r["health_not_ok"].values()), "0"),
            ("RSS after warm-up (MB)", "rss_base_mb", ""),
            ("RSS peak growth (MB)", "rss_peak_growth_mb", "< 300")]
    print(f"\n{'':28}{'quiet':>12}{'attacks':>12}{'target':>10}")
    for label, key, target in rows:
        get = key if callable(key) else (lambda r, k=key: r[k])
        cells = "".join(f"{_fmt(get(r)):>12}" for r in (quiet, loud))
        print(f"{label:28}{cells}{target:>10}")
    print(f"{'p95 attacks / quiet':28}{'':>12}{_fmt(ratio):>12}{'<= 2':>10}")
    print("\nattack statuses:")
    for name, statuses in loud["attacks"].items():
        print(f"  {name:32} {json.dumps(statuses)}")
    print(f"attacks with a 5xx, timeout or dropped connection: "
          f"{len(loud['attacks_failing'])} (target 0)")


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=5.0, help="Length of each arm.")
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = {}
    for name, attacks in (("quiet", False), ("attacks", True)):
        print(f"== {name}: {args.minutes:g} min", flush=True)
        with Server.llmctl_serve(args.model, "--max-num-seqs", "8", "--ctx-size", "1024",
                                 "--threads", str(args.threads)) as srv:
            results[name] = asyncio.run(run_arm(srv, args, attacks))
        print(json.dumps(results[name]), flush=True)
    report(results)
    if args.json:
        args.json.write_text(json.dumps({"settings": vars(args) | {"json": str(args.json)},
                                         "results": results}, indent=2))


if __name__ == "__main__":
    main()
