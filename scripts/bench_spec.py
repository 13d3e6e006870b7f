#!/usr/bin/env python3
"""Speculation (`--spec ngram`, and `--draft` with a draft model) against
plain decoding, side by side in one run, in-process through LLM: generated
tokens/s at each concurrency on prompts that repeat their input (an edit,
code, a RAG answer) and on one that does not, medians over rounds that
alternate between the engines; plus acceptance rates and whether every
answer was token-identical to plain decoding (greedy). `--spec-rows` sets
the cap on guessed rows per step, to find where speculation stops paying.

    .venv/bin/python scripts/bench_spec.py [--model qwen2.5-coder-0.5b] [--draft MODEL]
        [--tokens 128] [--rounds 3] [--levels 1,4,16] [--prompts edit,rag,free]
        [--spec-rows N] [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
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


def load_arms(args) -> dict[str, LLM]:
    """plain, ngram and (with --draft) draft engines. Prefix cache off, so
    every request computes the same work in each; flash attention on, the
    kernel under which checked rows are exact. --spec-rows replaces the
    scheduler's cap on guessed rows per step (the crossover experiment)."""
    arms = {"plain": {}, "ngram": {"spec": "ngram"}}
    if args.draft:
        arms["draft"] = {"draft": args.draft}
    engines = {}
    for name, kw in arms.items():
        llm = LLM.load(args.model, LoadOptions(max_num_seqs=16, threads=args.threads,
                                               prefix_cache=False, flash_attn=True, **kw))
        if args.spec_rows is not None:
            sched = llm.engine.scheduler
            sched.cfg = dataclasses.replace(sched.cfg, spec_rows=args.spec_rows)
        engines[name] = llm
    return engines


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--draft", default=None, help="Also measure this draft model.")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--levels", default="1,4,16")
    ap.add_argument("--prompts", default=",".join(PROMPTS))
    ap.add_argument("--spec-rows", type=int, default=None,
                    help="Guessed rows per step across sequences (default: the scheduler's).")
    ap.add_argument("--json", action="store_true")
    return ap.parse_args()


def measure(engines: dict[str, LLM], kinds: list[str], levels: list[int], args) -> tuple[dict, bool]:
    """Tokens/s of every pass by (prompt, concurrency, engine), and whether
    every engine's answers equalled plain decoding's."""
    speed: dict = {}
    identical = True
    for _ in range(args.rounds):
        for kind in kinds:
            for c in levels:
                texts = {}
                for name, llm in engines.items():
                    tps, texts[name] = one_pass(llm, kind, c, args.tokens)
                    speed.setdefault((kind, c, name), []).append(tps)
                identical &= all(t == texts["plain"] for t in texts.values())
    return speed, identical


def median_rows(speed: dict, kinds: list[str], levels: list[int], engines: dict,
                stats: dict) -> list[dict]:
    """One row per (prompt, concurrency): each engine's median tokens/s and
    each speculating engine's ratio to plain decoding."""
    rows = []
    for kind in kinds:
        for c in levels:
            row = {"prompt": kind, "concurrency": c}
            for name in engines:
                row[f"{name}_tok_s"] = statistics.median(speed[(kind, c, name)])
            for name in stats:
                row[f"{name}_ratio"] = row[f"{name}_tok_s"] / row["plain_tok_s"]
            rows.append(row)
    return rows


def print_table(args, rows: list[dict], engines: dict, stats: dict, identical: bool) -> None:
    print(f"{args.model}, {args.tokens} tokens, greedy, medians of {args.rounds} rounds")
    print(f"{'prompt':6} {'c':>3}" + "".join(f" {n + ' tok/s':>12}" for n in engines)
          + "".join(f" {n + ' x':>9}" for n in stats))
    for r in rows:
        print(f"{r['prompt']:6} {r['concurrency']:>3}"
              + "".join(f" {r[n + '_tok_s']:>12.1f}" for n in engines)
              + "".join(f" {r[n + '_ratio']:>8.2f}x" for n in stats))
    for n, st in stats.items():
        print(f"{n}: acceptance {st.spec_acceptance:.1%}, {st.spec_mean_accepted:.2f} guesses kept "
              "per step")
    print(f"answers identical to plain decoding: {identical}")


def main() -> int:
    args = parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    kinds = args.prompts.split(",")
    engines = load_arms(args)
    speed, identical = measure(engines, kinds, levels, args)
    stats = {name: llm.stats() for name, llm in engines.items() if name != "plain"}
    for llm in engines.values():
        llm.close()
    rows = median_rows(speed, kinds, levels, engines, stats)
    if args.json:
        result = {"model": args.model, "draft": args.draft, "rounds": args.rounds,
                  "tokens": args.tokens, "rows": rows, "all_answers_identical": identical,
                  "acceptance": {n: {"rate": st.spec_acceptance,
                                     "mean_accepted": st.spec_mean_accepted}
                                 for n, st in stats.items()}}
        print(json.dumps(result, indent=2))
        return 0
    print_table(args, rows, engines, stats, identical)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
