#!/usr/bin/env python3
"""The measuring half of scripts/gpu_check.sh: llmctl against llama.cpp's
own tools from the same build, on one GPU, in one run. Every result is
written to --out (one JSON) as soon as it is known, so a run cut short
keeps what it measured.

    python3 scripts/gpu_measure.py --model M.gguf --bin BUILD/bin --out R.json \\
        [--steps bench,serve,prefix,partial] [--tiny]

Steps (each under its own timeout):
  bench    llama-bench -ngl 99 -fa 1: pp512 and tg128.
  serve    llama-server and `llmctl serve`, the same slots and context, one
           at a time: 130-token prompts, 128 tokens out, concurrency 1, 16
           and 64 (`llmctl bench --url`).
  prefix   on `llmctl serve`: a 2,000-token prompt cold, again (a memory
           hit), and after a restart (a disk hit), with their greedy text.
  partial  `llmctl run` with 16 of the layers on the GPU, and none.
  serve-off  `llmctl serve --backend-sampling off`, as in serve.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmctl.bench.api import bench
from llmctl.bench.launcher import Server, http_ok

SLOTS, CTX = 64, 131072
LEVELS = ((1, 4), (16, 32), (64, 128))     # (concurrency, requests)


class Results:
    """The JSON file, rewritten whole (to a temporary file, then renamed)
    after every result."""

    def __init__(self, path: Path):
        self.path = path
        self.data: dict = json.loads(path.read_text()) if path.exists() else {}

    def put(self, key: str, value) -> None:
        self.data[key] = value
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1))
        tmp.replace(self.path)
        print(f"{key}: {json.dumps(value)[:300]}", flush=True)


def llama_bench(args, out: Results) -> None:
    r = subprocess.run([str(args.bin / "llama-bench"), "-m", str(args.model), "-ngl", "99",
                        "-fa", "1", "-p", "512", "-n", "128", "-r", "2", "-o", "json"],
                       capture_output=True, text=True, timeout=120)
    rows = json.loads(r.stdout)
    out.put("llama_bench", {("pp512" if row["n_prompt"] else "tg128"): row["avg_ts"]
                            for row in rows})


def _levels(url: str, args) -> dict:
    """The workload at each level against the server at `url`."""
    got = {}
    for conc, requests in LEVELS:
        n_out = 32 if args.tiny else 128
        run = bench(url=url + "/v1", concurrency=str(conc), requests=requests, input_tokens=130,
                    output_tokens=n_out, timeout=120)
        lv = run["levels"][0]
        got[f"c{conc}"] = {"tok_s": lv["output_tokens_per_s"], "ttft_p50": lv["ttft"]["p50"],
                           "itl_p50": lv["itl"]["p50"], "errors": lv["errors"],
                           "mean_out": lv["mean_output_tokens"]}
    return got


def llmctl(args, *flags: str) -> Server:
    return Server.llmctl_serve(str(args.model), "--n-gpu-layers", "99", "--max-num-seqs",
                               str(args.slots), "--ctx-size", str(args.ctx // args.slots),
                               *flags, env={"LLMCTL_HOME": str(args.home)},
                               startup_timeout=180)


def llama_server(args) -> Server:
    return Server([str(args.bin / "llama-server"), "-m", str(args.model), "-ngl", "99",
                   "-np", str(args.slots), "-c", str(args.ctx), "--host", "127.0.0.1"],
                  ready=http_ok("/health"), startup_timeout=180)


def serve(args, out: Results, off: bool = False) -> None:
    """llama-server then llmctl; with `off`, llmctl with backend sampling off."""
    arms = {"llama-server": lambda: llama_server(args), "llmctl": lambda: llmctl(args)}
    if off:
        arms = {"llmctl --backend-sampling off": lambda: llmctl(args, "--backend-sampling", "off")}
    for name, make in arms.items():
        with make() as srv:
            out.put(f"serve {name}", _levels(srv.url, args))
            if name == "llmctl":
                stats = httpx.get(srv.url + "/stats", timeout=30).json()
                out.put("llmctl stats", {k: stats.get(k) for k in (
                    "requests", "prompt_tokens", "prefix_cache_hit_tokens", "spec_steps")})


def _timed(url: str, ids: list[int], n: int = 8) -> tuple[float, str]:
    """(seconds to the first token, the greedy text) of `ids` as a prompt."""
    start = time.perf_counter()
    first, text = None, []
    with httpx.stream("POST", url + "/v1/completions", timeout=300, json={
            "prompt": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True,
            "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:])["choices"]
                if choices and choices[0].get("text"):
                    first = first or time.perf_counter()
                    text.append(choices[0]["text"])
    return (first or time.perf_counter()) - start, "".join(text)


def prefix(args, out: Results) -> None:
    n = 400 if args.tiny else 2000          # the tiny model's vocabulary is 32,000
    ids = [1000 + (i * 7919) % 30_000 for i in range(n)]
    other = [1000 + (i * 104_729) % 30_000 for i in range(n)]
    with llmctl(args) as srv:
        _timed(srv.url, other[:50])                      # warm: graphs, allocations
        cold, cold_text = _timed(srv.url, ids)
        hit, hit_text = _timed(srv.url, ids)
        cold2, _ = _timed(srv.url, other)
    time.sleep(2)                                       # the disk store's writes land
    with llmctl(args) as srv:
        _timed(srv.url, other[:50])
        disk, disk_text = _timed(srv.url, ids)
    out.put("prefix", {"cold_s": cold, "cold_again_s": cold2, "memory_hit_s": hit,
                       "disk_hit_s": disk, "memory_ratio": hit / cold, "disk_ratio": disk / cold,
                       "same_text_memory": hit_text == cold_text,
                       "same_text_disk": disk_text == cold_text})


def partial(args, out: Results) -> None:
    got = {}
    n_layers = 2 if args.tiny else 16
    for label, layers, n in (("gpu_16_layers", n_layers, 32), ("cpu", 0, 16)):
        r = subprocess.run([sys.executable, "-m", "llmctl", "run", str(args.model),
                            "Write a story about a lighthouse keeper and the sea.",
                            "--n-gpu-layers", str(layers), "--max-tokens", str(n),
                            "--temperature", "0", "--json", "--ctx-size", "512"],
                           capture_output=True, text=True, timeout=150,
                           env={**os.environ, "LLMCTL_HOME": str(args.home)})
        got[label] = json.loads(r.stdout) if r.returncode == 0 else {
            "rc": r.returncode, "stderr": r.stderr[-400:]}
    out.put("partial", got)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--bin", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", default="bench,serve,prefix,partial,serve-off")
    ap.add_argument("--slots", type=int, default=SLOTS)
    ap.add_argument("--ctx", type=int, default=CTX)
    ap.add_argument("--tiny", action="store_true", help="short outputs (a CPU rehearsal)")
    args = ap.parse_args()
    args.home = Path(tempfile.mkdtemp(prefix="llmctl-gpu-"))
    out = Results(args.out)
    steps = {"bench": llama_bench, "serve": serve, "prefix": prefix, "partial": partial,
             "serve-off": lambda a, o: serve(a, o, off=True)}
    for name in args.steps.split(","):
        start = time.perf_counter()
        try:
            steps[name](args, out)
        except Exception as e:      # one step's failure is a result; the next still runs
            out.put(f"{name} failed", f"{type(e).__name__}: {e}"[:500])
        out.put(f"{name} seconds", round(time.perf_counter() - start, 1))


if __name__ == "__main__":
    main()
