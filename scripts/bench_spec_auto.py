#!/usr/bin/env python3
"""Adaptive speculation against plain decoding and llama-server's n-gram
modes, side by side in one run: `llmctl serve --spec off` and `--spec auto`,
and llama-server with no speculation, `--spec-type ngram-simple` and
`ngram-mod`, on the same GGUFs, threads and flash-attention setting.

Tasks: bench/spec_tasks.py, thirteen in four kinds (free text, chat Q&A,
code edit, answer from a given document), greedy. Single stream: decode
tok/s per task (tokens after the first over the time after the first), and
each answer compared with plain decoding's. Then llmctl at each
concurrency level, off against auto: the tasks cycled over that many
concurrent requests, generated tokens over wall time. Acceptance comes
from each server's own counters (llmctl's /stats, llama-server's timings).
Every arm's server is up for the whole run and each task runs on all of
them back to back, the order turning each round: this machine drifts by
10-20% over minutes, which would otherwise land on whichever arm ran then.
With --rounds N each figure is the median of its N rounds, and auto/off
the median of each round's paired ratio; --peer-rounds runs llama-server's
arms in the first rounds only, which leaves more rounds for the pairs.

    .venv/bin/python scripts/bench_spec_auto.py [--models qwen2.5-coder-0.5b,...]
        [--tokens 192] [--levels 4,16] [--rounds 2] [--json FILE] [--skip-peers]
        [--variant NAME=FLAGS ...] [--tree NAME=DIR ...] [--peer-rounds N]

`--tree NAME=DIR` adds a `--spec auto` arm that runs the llmctl of another
source tree (a commit's parent, checked out with `git worktree add`), to
measure a change against it side by side.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from llmctl.bench.client import stream_chat
from llmctl.bench.launcher import Server, source_tree, variant
from llmctl.bench.spec_tasks import KINDS, TASKS
from llmctl.errors import UsageError
from llmctl.store.resolve import resolve_model

CTX = 2048
SLOTS = 16
OURS = {"llmctl off": ["--spec", "off"], "llmctl auto": ["--spec", "auto"]}
TREES: dict[str, Path] = {}     # arms of OURS run from another source tree (--tree)
PEERS = {"llama-server none": [], "llama-server ngram-simple": ["--spec-type", "ngram-simple"],
         "llama-server ngram-mod": ["--spec-type", "ngram-mod"]}


def spec_counts(url: str) -> dict:
    s = httpx.get(url + "/stats", timeout=30).json()
    return {k: s[k] for k in ("spec_steps", "spec_drafted_tokens", "spec_accepted_tokens",
                              "spec_declined_guesses")}


def single(url: str, model: str, prompt: str, tokens: int, ours: bool) -> dict:
    """One task's request, with what speculation did for it (ours only)."""
    before = spec_counts(url) if ours else None
    r = stream_chat(url, model, prompt, tokens)
    if before is not None:
        after = spec_counts(url)
        delta = {k: after[k] - before[k] for k in after}
        r["drafted"], r["accepted"] = delta["spec_drafted_tokens"], delta["spec_accepted_tokens"]
        r["declined"] = delta["spec_declined_guesses"]
    return r


def loaded(url: str, model: str, level: int, tokens: int) -> dict:
    prompts = [TASKS[i % len(TASKS)][2] for i in range(max(level, len(TASKS)))]
    start = time.perf_counter()
    with ThreadPoolExecutor(level) as pool:
        done = list(pool.map(lambda p: stream_chat(url, model, p, tokens), prompts))
    wall = time.perf_counter() - start
    return {"tok_s": sum(d["tokens"] for d in done) / wall, "requests": len(done)}


def run_model(args, model: str) -> dict:
    """Every arm's server up at once, idle but for the request in hand, so
    each task runs on every arm back to back (the order turning each
    round): this machine's drift over minutes then moves all arms alike
    instead of whichever ran last. Each llmctl arm has a prefix cache dir
    of its own, so none reads what another computed."""
    with contextlib.ExitStack() as stack:
        servers = {name: stack.enter_context(srv) for name, srv in _servers(args, model, stack)}
        for srv in servers.values():
            stream_chat(srv.url, model, "Say hello.", 8)        # warm-up
        rounds: dict[str, list[dict]] = {name: [] for name in servers}
        for i in range(args.rounds):
            print(f"== {model}: round {i + 1}", file=sys.stderr, flush=True)
            arms = [a for a in servers if a in OURS or i < args.peer_rounds]
            singles: dict[str, dict] = {name: {} for name in arms}
            for t, (kind, name, prompt) in enumerate(TASKS):
                for arm in _turn(arms, i + t):
                    r = single(servers[arm].url, model, prompt, args.tokens, arm in OURS)
                    singles[arm][name] = {"kind": kind, **r}
                print(f"   {name:16} " + "  ".join(
                    f"{_short(arm)} {singles[arm][name]['decode_tok_s'] or 0:6.2f}" for arm in arms),
                    file=sys.stderr, flush=True)
            loads: dict[str, dict] = {name: {} for name in OURS}
            for c in args.levels:
                for arm in _turn(list(OURS), i):
                    loads[arm][c] = loaded(servers[arm].url, model, c, args.tokens)
            for arm in arms:
                rounds[arm].append({"single": singles[arm], "loaded": loads.get(arm, {})})
    return {name: _median(runs) for name, runs in rounds.items()}


def _servers(args, model: str, stack: contextlib.ExitStack) -> list[tuple[str, Server]]:
    out = []
    for name, flags in OURS.items():
        cache = stack.enter_context(tempfile.TemporaryDirectory(prefix="llmctl-bench-cache-"))
        argv = [model, "--threads", str(args.threads), "--max-num-seqs", str(SLOTS),
                "--ctx-size", str(CTX), "--flash-attn", "on", *flags]
        out.append((name, Server.llmctl_serve(*argv, env={"LLMCTL_CACHE_DIR": cache},
                                              tree=TREES.get(name))))
    if args.llama_server is not None:
        base = [str(args.llama_server), "-m", str(resolve_model(model).path), "-np", "1",
                "-c", str(CTX), "-t", str(args.threads), "-tb", str(args.threads),
                "--host", "127.0.0.1", "--no-webui", "--jinja", "-fa", "on"]
        out += [(name, Server([*base, *flags], name="llama-server")) for name, flags in PEERS.items()]
    return out


def _short(arm: str) -> str:
    return arm.replace("llama-server", "ls").replace("llmctl ", "").replace("ngram-", "")


def _turn(arms: list[str], n: int) -> list[str]:
    n %= len(arms)
    return arms[n:] + arms[:n]


def _median(runs: list[dict]) -> dict:
    """One arm's rounds as one: each rate the median of its rounds, the
    counters summed, the text the first round's."""
    first = runs[0]
    single = {}
    for name, r in first["single"].items():
        all_r = [run["single"][name] for run in runs]
        single[name] = {**r, "decode_tok_s": statistics.median(x["decode_tok_s"] for x in all_r),
                        "rates": [x["decode_tok_s"] for x in all_r],
                        "identical_across_rounds": all(x["text"] == r["text"] for x in all_r)}
        for key in ("drafted", "accepted", "declined"):
            if r.get(key) is not None:
                single[name][key] = sum(x[key] for x in all_r)
    loaded_ = {c: {**first["loaded"][c], "tok_s": statistics.median(
        run["loaded"][c]["tok_s"] for run in runs), "rates": [run["loaded"][c]["tok_s"]
                                                             for run in runs]}
               for c in first["loaded"]}
    return {"single": single, "loaded": loaded_, "rounds": len(runs)}


def geomean(xs: list[float]) -> float:
    return statistics.geometric_mean(xs) if xs else float("nan")


def report(model: str, results: dict, levels: list[int]) -> None:
    arms = list(results)
    off = results["llmctl off"]["single"]
    auto = results["llmctl auto"]["single"]
    print(f"\n## {model}: single stream, decode tok/s (acceptance); task (tokens generated)")
    print(f"{'task':18}" + "".join(f"{a.replace('llama-server', 'ls'):>22}" for a in arms)
          + f"{'auto/off':>10}")
    ratios = paired(auto, off)
    for _, name, _ in TASKS:
        cells = "".join(f"{_cell(results[a]['single'][name]):>22}" for a in arms)
        label = f"{name} ({off[name]['tokens']})"
        print(f"{label:18}{cells}{ratios[name]:>10.2f}")
    kinds = [k for k in KINDS if _of(ratios, k)]
    for arm in arms:
        if arm.startswith("llmctl ") and arm != "llmctl off":
            r = paired(results[arm]["single"], off)
            pooled = geomean([x for n, t in results[arm]["single"].items()
                              for x in by_round(t, off[n])])
            print(f"{arm[7:]}/off (median of each round's paired ratio): min {min(r.values()):.2f}, "
                  f"per kind median " + ", ".join(f"{k} {statistics.median(_of(r, k)):.2f}"
                                                  for k in kinds)
                  + f"; every pair pooled x{pooled:.3f}")
    same = sum(auto[n]["text"] == off[n]["text"] for n in auto)
    print(f"auto's answers identical to plain decoding's: {same} of {len(auto)}")
    peers = [a for a in arms if a.startswith("llama-server")]
    for kind in kinds if peers else ():
        ours = geomean(_of({n: auto[n]["decode_tok_s"] for n in auto}, kind))
        best = max(peers, key=lambda a: geomean(_of(_rates(results[a]["single"]), kind)))
        theirs = geomean(_of(_rates(results[best]["single"]), kind))
        print(f"{kind:9} auto {ours:6.2f} tok/s vs llama-server's best ({best[13:]}) "
              f"{theirs:6.2f}: x{ours / theirs:.2f}")
    for c in levels:
        o = results["llmctl off"]["loaded"][c]
        # Every other arm under load too: an A/A arm's spread here is the
        # floor for auto's ratio at this level.
        for arm in (name for name in results if name.startswith("llmctl ") and name != "llmctl off"):
            a = results[arm]["loaded"][c]
            ratios = by_round(a, o)
            print(f"c={c:<3} off {o['tok_s']:7.2f} tok/s, {arm[7:]} {a['tok_s']:7.2f} tok/s: "
                  f"x{statistics.median(ratios):.2f} (rounds' paired ratios: "
                  + ", ".join(f"{x:.2f}" for x in ratios) + ")")


def paired(arm: dict, off: dict) -> dict:
    """Per task, the median over rounds of the arm's rate over plain
    decoding's in the same round: requests seconds apart share the
    machine's drift, which a ratio of medians taken across rounds would
    not cancel."""
    return {n: statistics.median(by_round(r, off[n])) for n, r in arm.items()}


def by_round(arm: dict, off: dict) -> list[float]:
    """Each round's rate of one arm's figure over plain decoding's."""
    return [a / o for a, o in zip(arm["rates"], off["rates"], strict=True)]


def _rates(single: dict) -> dict:
    return {n: r["decode_tok_s"] for n, r in single.items()}


def _of(values: dict, kind: str) -> list:
    kinds = {name: k for k, name, _ in TASKS}
    return [v for n, v in values.items() if kinds[n] == kind]


def _cell(r: dict) -> str:
    acc = f" ({r['accepted'] / r['drafted']:.0%})" if r.get("drafted") else ""
    return f"{r['decode_tok_s']:.2f}{acc}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="qwen2.5-coder-0.5b,qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=192)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="4,16")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--peer-rounds", type=int, default=1 << 30, metavar="N",
                    help="llama-server's arms run in the first N rounds only (default: all)")
    ap.add_argument("--json", type=Path, help="also write the raw results here")
    ap.add_argument("--tasks", help="only these tasks (names, comma-separated)")
    ap.add_argument("--auto-flags", default="", help="more serve flags for the auto arm")
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                    help="one more `--spec auto` arm with these serve flags, alternating "
                         "with the others (repeatable)")
    ap.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                    help="one more `--spec auto` arm from another source tree (repeatable)")
    args = ap.parse_args()
    global TASKS
    if args.tasks:
        TASKS = [t for t in TASKS if t[1] in args.tasks.split(",")]
    OURS["llmctl auto"] = [*OURS["llmctl auto"], *shlex.split(args.auto_flags)]
    for v in args.variant:
        name, flags = variant(v)
        OURS[f"llmctl {name}"] = ["--spec", "auto", *flags]
    for spec in args.tree:
        try:
            name, tree = source_tree(spec)
        except UsageError as e:
            sys.exit(str(e))
        OURS[f"llmctl {name}"] = ["--spec", "auto", *shlex.split(args.auto_flags)]
        TREES[f"llmctl {name}"] = tree
    args.levels = [int(x) for x in args.levels.split(",") if x]
    if args.skip_peers or not args.llama_server.exists():
        args.llama_server = None
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    everything = {}
    for model in args.models.split(","):
        everything[model] = run_model(args, model)
        if args.json:
            args.json.write_text(json.dumps(everything, indent=1))
    for model, results in everything.items():
        report(model, results, args.levels)


if __name__ == "__main__":
    main()
