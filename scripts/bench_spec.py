#!/usr/bin/env python3
"""Prompt-lookup speculation (`--spec ngram`) against plain decoding, side
by side in one run, in-process through LLM: generated tokens/s at
concurrency 1, 4 and 16 on prompts that repeat their input (an edit, code,
a RAG answer) and on one that does not, medians over rounds that alternate
between the two engines; plus the acceptance rate and whether every answer
was token-identical to plain decoding (greedy).

    .venv/bin/python scripts/bench_spec.py [--model qwen2.5-coder-0.5b] [--tokens 128]
        [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams

CODE = ("def parse(line):\n    key, _, value = line.partition('=')\n    return key.strip(), "
        "value.strip()\n\n\ndef load(path):\n    out = {}\n    with open(path) as f:\n        for line "
        "in f:\n            if line.strip() and not line.startswith('#'):\n                key, value "
        "= parse(line)\n                out[key] = value\n    return out\n")
PROMPTS = {
    "edit": "Rewrite this code with type hints, changing nothing else:\n\n" + CODE,
    "rag": "Context: The Zephyr-9 probe launched in 2031 from Kourou. The Zephyr-9 probe "
           "carries a magnetometer, a dust counter and a wide-angle camera. The Zephyr-9 probe "
           "reached Jupiter in 2036.\n\nUsing only the context, say when and where the Zephyr-9 "
           "probe launched, what the Zephyr-9 probe carries and when it reached Jupiter.",
    "free": "Write a short story about a lighthouse keeper who finds a message in a bottle.",
}


def one_pass(llm: LLM, kind: str, concurrency: int, tokens: int) -> tuple[float, list[str]]:
    prompt = llm.chat_tokens([{"role": "user", "content": PROMPTS[kind]}])
    params = SamplingParams(temperature=0, max_tokens=tokens)
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda _: llm.complete(prompt, params), range(concurrency)))
    wall = time.perf_counter() - start
    return sum(c.usage.completion_tokens for c in done) / wall, [c.text for c in done]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    engines = {}
    for spec in (None, "ngram"):
        # Prefix cache off, so every request computes the same work in both;
        # flash attention on, the kernel under which checked rows are exact.
        engines[spec or "plain"] = LLM.load(args.model, LoadOptions(
            max_num_seqs=16, threads=args.threads, prefix_cache=False, flash_attn=True,
            spec=spec))
    speed: dict = {}
    identical = True
    for _ in range(args.rounds):
        for kind in PROMPTS:
            for c in levels:
                texts = {}
                for name, llm in engines.items():
                    tps, texts[name] = one_pass(llm, kind, c, args.tokens)
                    speed.setdefault((kind, c, name), []).append(tps)
                identical &= texts["plain"] == texts["ngram"]
    stats = engines["ngram"].stats()
    for llm in engines.values():
        llm.close()
    rows = [{"prompt": kind, "concurrency": c,
             "plain_tok_s": statistics.median(speed[(kind, c, "plain")]),
             "ngram_tok_s": statistics.median(speed[(kind, c, "ngram")])}
            for kind in PROMPTS for c in levels]
    for r in rows:
        r["ratio"] = r["ngram_tok_s"] / r["plain_tok_s"]
    result = {"model": args.model, "rounds": args.rounds, "tokens": args.tokens, "rows": rows,
              "acceptance_rate": stats.spec_acceptance,
              "mean_accepted_per_step": stats.spec_mean_accepted,
              "all_answers_identical": identical}
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{args.model}, {args.tokens} tokens, greedy, medians of {args.rounds} rounds")
    print(f"{'prompt':6} {'c':>3} {'plain tok/s':>12} {'ngram tok/s':>12} {'ratio':>7}")
    for r in rows:
        print(f"{r['prompt']:6} {r['concurrency']:>3} {r['plain_tok_s']:>12.1f} "
              f"{r['ngram_tok_s']:>12.1f} {r['ratio']:>6.2f}x")
    print(f"acceptance {stats.spec_acceptance:.1%}, {stats.spec_mean_accepted:.2f} guesses kept "
          f"per step; answers identical to plain decoding: {identical}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
