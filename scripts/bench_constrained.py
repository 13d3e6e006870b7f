#!/usr/bin/env python3
"""Constrained (JSON Schema grammar) against unconstrained decoding, side by
side in one run, in-process through LLM (no server): aggregate generated
tokens/s at concurrency 1 and 8, medians over rounds, and their ratio.

The schema asks for a long array of records (minItems 50), so a constrained
request runs to max_tokens like an unconstrained one with ignore_eos; rounds
alternate between the two so machine noise hits both.

    .venv/bin/python scripts/bench_constrained.py [--model smollm2] [--tokens 128]
        [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

from llmctl.runtime.formats.grammar import json_schema_grammar
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams

SCHEMA = {"type": "array", "minItems": 50, "items": {
    "type": "object", "additionalProperties": False, "required": ["id", "name", "active"],
    "properties": {"id": {"type": "integer"}, "name": {"type": "string", "maxLength": 16},
                   "active": {"type": "boolean"}}}}
PROMPT = "Write a JSON array of {n} users, each with an id, a name and an active flag."


def one_round(llm: LLM, concurrency: int, params: SamplingParams, salt: int) -> float:
    """Generated tokens per second of wall time for `concurrency` requests."""
    jobs = [llm.chat_tokens([{"role": "user", "content": PROMPT.format(n=salt * 10 + i)}])
            for i in range(concurrency)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        done = list(pool.map(lambda tokens: llm.complete(tokens, params), jobs))
    wall = time.perf_counter() - start
    return sum(c.usage.completion_tokens for c in done) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    kinds = {
        "unconstrained": SamplingParams(seed=1, max_tokens=args.tokens, ignore_eos=True),
        "json_schema": SamplingParams(seed=1, max_tokens=args.tokens,
                                      grammar=json_schema_grammar(SCHEMA)),
    }
    results: dict[int, dict[str, float]] = {}
    opts = LoadOptions(max_num_seqs=8, ctx_size=args.tokens + 128, threads=args.threads,
                       prefix_cache=False)
    with LLM.load(args.model, opts) as llm:
        one_round(llm, 1, kinds["json_schema"], 0)      # warm-up
        for concurrency in (1, 8):
            rates: dict[str, list[float]] = {k: [] for k in kinds}
            for r in range(args.rounds):
                for kind, params in kinds.items():
                    rates[kind].append(one_round(llm, concurrency, params, r + 1))
            med = {k: statistics.median(v) for k, v in rates.items()}
            med["ratio"] = med["json_schema"] / med["unconstrained"]
            results[concurrency] = med
    if args.json:
        print(json.dumps({"model": args.model, "tokens": args.tokens, "rounds": args.rounds,
                          "tok_per_s": {str(c): m for c, m in results.items()}}, indent=2))
        return
    print(f"model {args.model}, {args.tokens} tokens per request, median of {args.rounds} rounds")
    print(f"{'concurrency':>11}  {'unconstrained':>13}  {'json_schema':>11}  {'ratio':>5}")
    for c, m in results.items():
        print(f"{c:>11}  {m['unconstrained']:>9.1f} t/s  {m['json_schema']:>7.1f} t/s  "
              f"{m['ratio']:>5.2f}")


if __name__ == "__main__":
    main()
