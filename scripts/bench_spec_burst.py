#!/usr/bin/env python3
"""`--spec auto` under load, in process: the held-out tasks
(bench/spec_tasks.py) as N concurrent greedy requests on one engine,
plain decoding and auto alternating round by round, each on a fresh
engine, with no prefix cache. Per run: generated tokens over wall time,
the rows decoded, the time inside llama_decode, the graph runs llama.cpp
splits the decodes into (counted by its splitting rule), what
speculation checked, kept and says it saved, and when the first and the
median request finished (a burst's wall time is its slowest request's).

    .venv/bin/python scripts/bench_spec_burst.py [--model qwen2.5-coder-0.5b]
        [--concurrency 16] [--tokens 128] [--rounds 3] [--threads N]
        [--variant NAME=SPEC]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from llmctl.bench.spec_tasks import TASKS
from llmctl.runtime import llama
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.system import default_threads

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_step import _count_decodes, _timed  # noqa: E402

TOTALS: dict[str, list] = {}     # name: [seconds, calls], as profile_step keeps them
DECODES: dict[str, int] = {}     # rows, graphs, calls: profile_step._count_decodes


def run(args, spec: str | None) -> dict:
    """One burst on a fresh engine: every request at once, greedy."""
    # No prefix cache: its disk copy outlives the engine, and the arm that
    # ran second would skip the prompts the first computed.
    opts = dataclasses.replace(LoadOptions(threads=args.threads, max_num_seqs=args.concurrency,
                                           flash_attn=True, prefix_cache=False), spec=spec)
    with LLM.load(args.model, opts) as llm:
        prompts = [llm.chat_tokens([{"role": "user", "content": TASKS[i % len(TASKS)][2]}])
                   for i in range(max(args.concurrency, len(TASKS)))]
        llm.complete(prompts[0], SamplingParams(max_tokens=4))
        s0 = llm.stats().as_dict()
        TOTALS.clear()
        DECODES.clear()
        start = time.perf_counter()

        def one(p: list[int]) -> tuple[int, float]:
            c = llm.complete(p, SamplingParams(temperature=0, max_tokens=args.tokens))
            return c.usage.completion_tokens, time.perf_counter() - start
        with ThreadPoolExecutor(args.concurrency) as pool:
            done = list(pool.map(one, prompts))
        wall = time.perf_counter() - start
        s1 = llm.stats().as_dict()
    delta = {k: s1[k] - s0[k] for k in ("spec_steps", "spec_drafted_tokens",
                                        "spec_accepted_tokens", "spec_saved_s")}
    ends = sorted(t for _, t in done)
    return {"tok_s": sum(n for n, _ in done) / wall, "wall": wall, **DECODES,
            "tokens": sum(n for n, _ in done), "decode": TOTALS.get("decode", [0.0])[0],
            "first_end": ends[0], "median_end": statistics.median(ends), **delta}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--variant", action="append", default=[], metavar="NAME=SPEC",
                    help="one more arm with this --spec mode (repeatable)")
    args = ap.parse_args()
    _count_decodes(DECODES)
    _timed(llama.LlamaContext, "decode", TOTALS)
    arms: dict[str, str | None] = {"off": None, "auto": "auto"}
    arms.update(v.split("=", 1) for v in args.variant)
    runs: dict[str, list[dict]] = {a: [] for a in arms}
    for i in range(args.rounds):
        order = list(arms)[i % len(arms):] + list(arms)[:i % len(arms)]
        for arm in order:
            r = run(args, arms[arm])
            runs[arm].append(r)
            print(f"round {i + 1} {arm:6}: {r['tok_s']:6.2f} tok/s ({r['tokens']} tokens, wall "
                  f"{r['wall']:.1f} s, first done {r['first_end']:.1f} s, median "
                  f"{r['median_end']:.1f} s), {r['rows']} rows in {r['calls']} decodes, {r['graphs']} "
                  f"graph runs, llama_decode {r['decode']:.1f} s, "
                  f"checked {r['spec_drafted_tokens']} kept {r['spec_accepted_tokens']} in "
                  f"{r['spec_steps']} steps, saved {r['spec_saved_s']:+.2f} s", flush=True)
    for arm in arms:
        if arm != "off":
            ratios = [a["tok_s"] / o["tok_s"] for a, o in zip(runs[arm], runs["off"], strict=True)]
            print(f"{arm}/off at c={args.concurrency}: median x{statistics.median(ratios):.3f} "
                  f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})")


if __name__ == "__main__":
    main()
