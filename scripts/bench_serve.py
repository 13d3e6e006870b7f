#!/usr/bin/env python3
"""Serving throughput and latency, side by side in one run: `llmctl serve`
against llama.cpp's llama-server and llama-cpp-python's server, same model,
same threads, same workload.

Workload: prompts of ~130 tokens (unique per request), 128 generated tokens
(--output-tokens) with ignore_eos; concurrency 1 (8 requests) and 16 (32
requests). Every server is started once and stays up (idle, it takes no
CPU); each level then runs on one server at a time, so each has the whole
machine, and the servers take turns level by level, in reversed order every
other round, so that a pair of arms is measured a minute apart rather than
several (this machine drifts by 10-15% over minutes). Each round's ratio of
llmctl to every peer is reported, with their median and the medians of
each metric.
`--variant NAME='FLAGS'` adds an llmctl arm with those serve flags (e.g.
fa='--flash-attn on'), and `--peer-variant NAME='FLAGS'` a llama-server arm
(e.g. fa-off='-fa off': llama-server turns flash attention on by default).
`--tree NAME=DIR` adds an arm that runs the llmctl of another source tree
(DIR holds its `llmctl/`, e.g. `git worktree add DIR COMMIT`), to measure a
change against its parent side by side; `--serve-flags` go to every llmctl
arm. `--against NAME` reports each llmctl arm against the variant NAME too
(`default` for the plain arm); `--levels` picks the levels (c4, 16 requests
at 4, runs only when named).

    .venv/bin/python scripts/bench_serve.py [--llama-server PATH] [--skip-peers]
        [--model smollm2] [--output-tokens 128] [--variant NAME='FLAGS' ...]
        [--peer-variant NAME='FLAGS' ...] [--against NAME ...] [--levels c1,c4,c16]

llama-server is looked for at $LLAMA_SERVER or /tmp/llama-server-build/bin/
(build it from llama-cpp-python's vendored llama.cpp with the same CPU flags).
llama-cpp-python's server needs its extras (sse-starlette, starlette-context,
pydantic-settings); it is skipped when they are missing.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
from collections.abc import Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

from llmctl.bench.api import bench
from llmctl.bench.launcher import Server, http_ok, source_tree, variant
from llmctl.errors import UsageError
from llmctl.runtime.system import default_threads
from llmctl.store.resolve import resolve_model

CTX_PER_SEQ = 512
# llama-cpp-python's server has no /health; /v1/models answers once it is up.
READY = http_ok("/health", "/v1/models")


def servers(threads: int, llama_server: Path | None, peers: bool, name: str = "smollm2",
            variants: tuple[str, ...] = (), peer_variants: tuple[str, ...] = (),
            trees: tuple[str, ...] = (), serve_flags: tuple[str, ...] = (),
            ) -> dict[str, Callable[[], Server]]:
    """Each server to measure, as a factory: a port is picked at start.
    Raises UsageError for a tree without an llmctl package."""
    model = str(resolve_model(name).path)
    ours = [name, "--max-num-seqs", "16", "--ctx-size", str(CTX_PER_SEQ), "--threads", str(threads),
            *serve_flags]
    out = {"llmctl serve": partial(Server.llmctl_serve, *ours)}
    for label, flags in map(variant, variants):
        out[f"llmctl serve {label}"] = partial(Server.llmctl_serve, *ours, *flags)
    for label, tree in map(source_tree, trees):
        out[f"llmctl serve {label}"] = partial(Server.llmctl_serve, *ours, tree=tree)
    if peers and llama_server and llama_server.exists():
        theirs = [str(llama_server), "-m", model, "-np", "16", "-c", str(16 * CTX_PER_SEQ),
                  "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1"]
        out["llama-server -np 16"] = partial(Server, theirs, ready=READY)
        for label, flags in map(variant, peer_variants):
            out[f"llama-server -np 16 {label}"] = partial(Server, [*theirs, *flags], ready=READY)
    if peers and _has_lcp_server():
        out["llama-cpp-python server"] = partial(
            Server, [sys.executable, "-m", "llama_cpp.server", "--model", model,
                     "--n_ctx", str(CTX_PER_SEQ * 2), "--n_threads", str(threads),
                     "--host", "127.0.0.1"],
            name="llama_cpp.server", ready=READY)
    return out


def _has_lcp_server() -> bool:
    try:
        import pydantic_settings  # noqa: F401
        import sse_starlette  # noqa: F401
        import starlette_context  # noqa: F401
    except ImportError:
        return False
    return True


def level(run: dict) -> dict:
    lv = run["levels"][0]
    return {"tok_s": lv["output_tokens_per_s"], "ttft_p50": lv["ttft"]["p50"],
            "ttft_p95": lv["ttft"]["p95"], "errors": lv["errors"],
            "out_tokens_mean": lv["mean_output_tokens"]}


LEVELS = {"c1": (8, "1"), "c4": (16, "4"), "c16": (32, "16")}   # level: (requests, concurrency)
# The ratios reported: (level, metric, label).
RATIOS = (("c16", "tok_s", "c=16 tok/s"), ("c16", "ttft_p50", "c=16 TTFT p50"),
          ("c4", "tok_s", "c=4 tok/s"), ("c1", "tok_s", "c=1 tok/s"))


def _load(url: str, requests: int, concurrency: str, output_tokens: int) -> dict:
    """The workload's prompts sent to the server at `url`: bench's report."""
    return bench(requests=requests, concurrency=concurrency, url=url + "/v1",
                 input_tokens=130, output_tokens=output_tokens, timeout=900)


def measure(url: str, lvl: str, output_tokens: int = 128) -> dict:
    """One level of the workload against the server at `url`."""
    return level(_load(url, *LEVELS[lvl], output_tokens))


def median_run(runs: list[dict]) -> dict:
    """Per metric, the median over rounds (each round ran every server)."""
    return {lvl: {k: statistics.median(r[lvl][k] for r in runs) for k in runs[0][lvl]}
            for lvl in runs[0]}


def run_rounds(started: dict[str, Server], rounds: int, output_tokens: int,
               levels: tuple[str, ...] = tuple(LEVELS)) -> dict[str, list[dict]]:
    """Every level of every round on each server in turn: forward in even
    rounds, reversed in odd ones. Each server first answers a short warm-up
    (its weights paged in, its threads started)."""
    for srv in started.values():
        _load(srv.url, 2, "1", 8)
    runs: dict[str, list[dict]] = {name: [] for name in started}
    for i in range(rounds):
        order = list(started) if i % 2 == 0 else list(reversed(started))
        for name in order:
            runs[name].append({})
        for lvl in levels:
            for name in order:
                print(f"== round {i + 1}, {lvl}: {name}", flush=True)
                runs[name][-1][lvl] = measure(started[name].url, lvl, output_tokens)
                print(json.dumps(runs[name][-1][lvl]), flush=True)
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-server", type=Path,
                    default=Path(os.environ.get("LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--rounds", type=int, default=3,
                    help="Rounds over all servers; medians are reported (the box is noisy).")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--model", default="smollm2",
                    help="Registry name served by every server (e.g. qwen2.5-coder-0.5b).")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME='SERVE FLAGS': one more llmctl arm, e.g. fa='--flash-attn on'.")
    ap.add_argument("--peer-variant", action="append", default=[],
                    help="NAME='FLAGS': one more llama-server arm, e.g. fa-off='-fa off'.")
    ap.add_argument("--tree", action="append", default=[],
                    help="NAME=DIR: one more llmctl arm, run from the source tree DIR.")
    ap.add_argument("--serve-flags", default="",
                    help="Flags for every llmctl arm, e.g. '--flash-attn on'.")
    ap.add_argument("--levels", default="c1,c16",
                    help="Which levels to run: c1 (8 requests, one at a time), c4 (16 at "
                         "4), c16 (32 at 16); c4 only when named.")
    ap.add_argument("--against", action="append", default=[], metavar="NAME",
                    help="Also report every llmctl arm against the variant NAME "
                         "(e.g. nospec, for --variant nospec='--spec off').")
    args = ap.parse_args()
    levels = tuple(x for x in args.levels.split(",") if x)
    if not levels or any(x not in LEVELS for x in levels):
        ap.error(f"--levels: pick from {', '.join(LEVELS)}")
    try:
        factories = servers(args.threads, args.llama_server, not args.skip_peers, args.model,
                            tuple(args.variant), tuple(args.peer_variant), tuple(args.tree),
                            tuple(shlex.split(args.serve_flags)))
    except UsageError as e:
        ap.error(str(e))
    with ExitStack() as stack:
        started = {name: stack.enter_context(make()) for name, make in factories.items()}
        runs = run_rounds(started, args.rounds, args.output_tokens, levels)
    results = {name: median_run(r) for name, r in runs.items()}
    print(f"\nmedians over {args.rounds} rounds")
    print(f"{'server':28} {'c=1 tok/s':>10} {'c=4 tok/s':>10} {'c=16 tok/s':>11} "
          f"{'c=16 TTFT p50':>14} {'p95':>8} {'errors':>7}")
    nan = {"tok_s": float("nan"), "ttft_p50": float("nan"), "ttft_p95": float("nan"), "errors": 0}
    for name, r in results.items():
        c1, c4, c16 = r.get("c1", nan), r.get("c4", nan), r.get("c16", nan)
        print(f"{name:28} {c1['tok_s']:10.1f} {c4['tok_s']:10.1f} {c16['tok_s']:11.1f} "
              f"{c16['ttft_p50']:13.2f}s {c16['ttft_p95']:7.2f}s "
              f"{c1['errors'] + c4['errors'] + c16['errors']:7.0f}")
    against = tuple(f"llmctl serve {a}".strip() if a != "default" else "llmctl serve"
                    for a in args.against)
    ratios = {label: _ratios(label, runs, against) for label in runs
              if label.startswith("llmctl serve")}
    if args.json:
        args.json.write_text(json.dumps({"medians": results, "ratios": ratios, "runs": runs},
                                        indent=2))


def _ratios(label: str, runs: dict[str, list[dict]], against: tuple[str, ...] = ()) -> dict:
    """Per peer (and llmctl arm named in `against`) and metric, each
    round's ratio of `label` to it (the two measured side by side) and
    their median; printed as it goes."""
    out: dict = {}
    for name, theirs in runs.items():
        if name == label or (name.startswith("llmctl serve") and name not in against):
            continue
        line = []
        for lvl, key, shown in RATIOS:
            if lvl not in theirs[0]:
                continue
            each = [o[lvl][key] / t[lvl][key] for o, t in zip(runs[label], theirs, strict=True)]
            out.setdefault(name, {})[f"{lvl} {key}"] = {"rounds": each,
                                                        "median": statistics.median(each)}
            line.append(f"{shown} x{statistics.median(each):.2f} "
                        f"({', '.join(f'{r:.2f}' for r in each)})")
        print(f"{label}/{name}: " + "; ".join(line))
    return out


if __name__ == "__main__":
    main()
