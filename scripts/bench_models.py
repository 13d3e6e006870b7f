#!/usr/bin/env python3
"""Loading on demand, measured side by side in one run.

1. Cold model: the time to the first token of the first request to a model
   the server has not loaded (`llmctl serve` started with no model), against
   `llmctl run MODEL PROMPT` of the same model (process start to the first
   byte of the answer). Both load the model; the server's process is warm.
2. A repeated ~1,000-token prefix after the model was unloaded and loaded
   again: TTFT of the repeat (the prefix from the disk cache) against the
   TTFT of the first, cold prefill on a loaded model. The reload itself is
   timed apart (an empty /api/generate loads the model), and also reported
   added to the repeat's TTFT. Target: repeat ≤ 0.2× cold.

Every round uses fresh random text, so no cache helps a cold request. KV
memory per type and q8_0 throughput are in scripts/bench_kv_quant.py.

    .venv/bin/python scripts/bench_models.py [--model qwen2.5-coder-0.5b] [--rounds 3]
        [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from llmctl.bench.launcher import Server

WORDS = ("river stone lamp garden window copper forest signal harbor violet engine "
         "meadow silver thunder candle orbit marble whisper lantern canyon").split()


def text(n_words: int, rnd: random.Random) -> str:
    return " ".join(rnd.choice(WORDS) for _ in range(n_words))


def ttft(url: str, model: str, prompt: str, max_tokens: int = 4) -> tuple[float, dict]:
    """Seconds to the first streamed token of a chat request, and its usage."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, first, usage = time.perf_counter(), None, {}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if first is None and any(c["delta"].get("content") for c in chunk["choices"]):
                first = time.perf_counter() - t0
            usage = chunk.get("usage") or usage
    return first if first is not None else time.perf_counter() - t0, usage


def run_ttft(model: str, prompt: str, threads: int, env: dict) -> float:
    """`llmctl run`: process start to the first byte of the answer."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "llmctl", "run", model, prompt,
                             "--max-tokens", "4", "--temperature", "0",
                             "--threads", str(threads)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    proc.stdout.read(1)
    first = time.perf_counter() - t0
    proc.communicate(timeout=600)
    if proc.returncode:
        raise RuntimeError(f"llmctl run exited with {proc.returncode}")
    return first


def generate(url: str, model: str, keep_alive) -> float:
    """An empty /api/generate: loads the model (or unloads it with 0)."""
    t0 = time.perf_counter()
    httpx.post(url + "/api/generate", json={"model": model, "keep_alive": keep_alive},
               timeout=600).raise_for_status()
    return time.perf_counter() - t0


def one_round(args, env: dict, rnd: random.Random) -> dict:
    out = {"run_ttft_s": run_ttft(args.model, text(30, rnd), args.threads, env)}
    with Server.llmctl_serve("--threads", str(args.threads), "--ctx-size", "2048",
                             "--max-num-seqs", "4", env=env) as srv:
        out["serve_cold_ttft_s"], _ = ttft(srv.url, args.model, text(30, rnd))
        prefix = text(args.prefix_words, rnd)
        out["prefill_ttft_s"], usage = ttft(srv.url, args.model, prefix + " Name a colour.")
        out["prompt_tokens"] = usage.get("prompt_tokens")
        generate(srv.url, args.model, 0)                      # unload
        out["reload_s"] = generate(srv.url, args.model, "5m")
        out["repeat_ttft_s"], usage = ttft(srv.url, args.model, prefix + " Name a fruit.")
        out["repeat_cached_tokens"] = usage.get("prompt_tokens_details", {}).get("cached_tokens")
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefix-words", type=int, default=900, help="~1,000 tokens")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    home = tempfile.mkdtemp(prefix="llmctl-bench-models-")
    env = {**os.environ, "LLMCTL_HOME": home}
    # Put the model in this store first (part packages are joined once), so
    # no round pays for that.
    subprocess.run([sys.executable, "-m", "llmctl", "show", args.model], env=env, check=True,
                   capture_output=True, timeout=600)
    rnd = random.Random(13)
    rounds = [one_round(args, env, rnd) for _ in range(args.rounds)]
    med = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]
           if isinstance(rounds[0][k], float)}
    result = {"model": args.model, "threads": args.threads, "rounds": rounds, "median": med,
              "prompt_tokens": rounds[0]["prompt_tokens"],
              "cold_serve_vs_run": med["serve_cold_ttft_s"] / med["run_ttft_s"],
              "repeat_vs_prefill": med["repeat_ttft_s"] / med["prefill_ttft_s"],
              "reload_plus_repeat_vs_prefill":
                  (med["reload_s"] + med["repeat_ttft_s"]) / med["prefill_ttft_s"]}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.model}, {args.threads} threads, medians of {args.rounds} rounds")
    print(f"  cold model: serve first-request TTFT {med['serve_cold_ttft_s']:.2f} s, "
          f"llmctl run {med['run_ttft_s']:.2f} s ({result['cold_serve_vs_run']:.2f}x)")
    print(f"  {result['prompt_tokens']}-token prompt: cold prefill TTFT {med['prefill_ttft_s']:.2f} s;"
          f" after unload + reload: TTFT {med['repeat_ttft_s']:.2f} s "
          f"({result['repeat_vs_prefill']:.3f}x, {rounds[0]['repeat_cached_tokens']} tokens "
          f"from disk); reload {med['reload_s']:.2f} s "
          f"(with it: {result['reload_plus_repeat_vs_prefill']:.2f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
