#!/usr/bin/env python3
"""Serving throughput and latency, side by side in one run: `llmctl serve`
against llama.cpp's llama-server and llama-cpp-python's server, same model,
same threads, same workload.

Workload: prompts of ~130 tokens (unique per request), 128 generated tokens
(--output-tokens) with ignore_eos; concurrency 1 (8 requests) and 16 (32
requests). Servers run one after another, so each has the whole machine.
`--variant NAME='FLAGS'` adds an llmctl arm with those serve flags (e.g.
fa='--flash-attn on'), and `--peer-variant NAME='FLAGS'` a llama-server arm
(e.g. fa-off='-fa off': llama-server turns flash attention on by default).

    .venv/bin/python scripts/bench_serve.py [--llama-server PATH] [--skip-peers]
        [--model smollm2] [--output-tokens 128] [--variant NAME='FLAGS' ...]
        [--peer-variant NAME='FLAGS' ...]

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
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

from llmctl.bench.api import bench
from llmctl.bench.launcher import Server, http_ok
from llmctl.runtime.system import default_threads
from llmctl.store.resolve import resolve_model

CTX_PER_SEQ = 512
# llama-cpp-python's server has no /health; /v1/models answers once it is up.
READY = http_ok("/health", "/v1/models")


def servers(threads: int, llama_server: Path | None, peers: bool, name: str = "smollm2",
            variants: tuple[str, ...] = (), peer_variants: tuple[str, ...] = (),
            ) -> dict[str, Callable[[], Server]]:
    """Each server to measure, as a factory: a port is picked at start."""
    model = str(resolve_model(name).path)
    ours = [name, "--max-num-seqs", "16", "--ctx-size", str(CTX_PER_SEQ), "--threads", str(threads)]
    out = {"llmctl serve": partial(Server.llmctl_serve, *ours)}
    for label, flags in map(_variant, variants):
        out[f"llmctl serve {label}"] = partial(Server.llmctl_serve, *ours, *flags)
    if peers and llama_server and llama_server.exists():
        theirs = [str(llama_server), "-m", model, "-np", "16", "-c", str(16 * CTX_PER_SEQ),
                  "-t", str(threads), "-tb", str(threads), "--host", "127.0.0.1"]
        out["llama-server -np 16"] = partial(Server, theirs, ready=READY)
        for label, flags in map(_variant, peer_variants):
            out[f"llama-server -np 16 {label}"] = partial(Server, [*theirs, *flags], ready=READY)
    if peers and _has_lcp_server():
        out["llama-cpp-python server"] = partial(
            Server, [sys.executable, "-m", "llama_cpp.server", "--model", model,
                     "--n_ctx", str(CTX_PER_SEQ * 2), "--n_threads", str(threads),
                     "--host", "127.0.0.1"],
            name="llama_cpp.server", ready=READY)
    return out


def _variant(spec: str) -> tuple[str, list[str]]:
    """NAME='FLAGS' as the arm's label and its argv words."""
    label, _, flags = spec.partition("=")
    return label, shlex.split(flags)


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


def measure(url: str, output_tokens: int = 128) -> dict:
    common = dict(url=url + "/v1", input_tokens=130, output_tokens=output_tokens, timeout=900)
    c1 = bench(requests=8, concurrency="1", **common)
    c16 = bench(requests=32, concurrency="16", **common)
    return {"c1": level(c1), "c16": level(c16)}


def median_run(runs: list[dict]) -> dict:
    """Per metric, the median over rounds (each round ran every server)."""
    import statistics

    return {lvl: {k: statistics.median(r[lvl][k] for r in runs) for k in runs[0][lvl]}
            for lvl in ("c1", "c16")}


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
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {}
    for i in range(args.rounds):
        for name, server in servers(args.threads, args.llama_server, not args.skip_peers,
                                    args.model, tuple(args.variant),
                                    tuple(args.peer_variant)).items():
            print(f"== round {i + 1}: {name}", flush=True)
            with server() as srv:
                runs.setdefault(name, []).append(measure(srv.url, args.output_tokens))
            print(json.dumps(runs[name][-1]), flush=True)
    results = {name: median_run(r) for name, r in runs.items()}
    print(f"\nmedians over {args.rounds} rounds")
    print(f"{'server':28} {'c=1 tok/s':>10} {'c=16 tok/s':>11} {'c=16 TTFT p50':>14} "
          f"{'p95':>8} {'errors':>7}")
    for name, r in results.items():
        print(f"{name:28} {r['c1']['tok_s']:10.1f} {r['c16']['tok_s']:11.1f} "
              f"{r['c16']['ttft_p50']:13.2f}s {r['c16']['ttft_p95']:7.2f}s "
              f"{r['c1']['errors'] + r['c16']['errors']:7.0f}")
    for label in [n for n in results if n.startswith("llmctl serve")]:
        _ratios(label, results)
    if args.json:
        args.json.write_text(json.dumps({"medians": results, "runs": runs}, indent=2))


def _ratios(label: str, results: dict) -> None:
    ours = results[label]
    for name, r in results.items():
        if not name.startswith("llmctl serve"):
            print(f"{label}/{name}: c=16 tok/s x{ours['c16']['tok_s'] / r['c16']['tok_s']:.2f}, "
                  f"c=16 TTFT p50 x{ours['c16']['ttft_p50'] / r['c16']['ttft_p50']:.2f}, "
                  f"c=1 tok/s x{ours['c1']['tok_s'] / r['c1']['tok_s']:.2f}")


if __name__ == "__main__":
    main()
