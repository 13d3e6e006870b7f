#!/usr/bin/env python3
"""How far answers after moved cached runs agree with a cold prefill, and
how many prompt tokens the move saves: the figures --move-cached-runs'
default comes from (docs/prefix-cache.md).

For each model: an agent-shaped system prompt (rules, then tools) whose
early line changes per run (a working directory and a time). One engine
has moving on and is primed with run 0; each later run's request is then
answered from the moved runs and, on an engine with the prefix cache off,
cold. Per request: the prompt tokens reused, whether the greedy answers
are identical, where they first part and the cold run's gap between its
top two candidates there, and the largest change of a chosen token's
log-probability before that point.

Usage: .venv/bin/python scripts/bench_cache_moves.py [--models smollm2,qwen2.5-coder-0.5b]
           [--runs 6] [--min-run 64] [--tokens 1500] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from llmctl.runtime.llm import LLM
from llmctl.runtime.load_options import LoadOptions
from llmctl.runtime.sampling import SamplingParams

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_agent import QUESTIONS, agent_request, system  # noqa: E402

GREEDY = SamplingParams(max_tokens=32, temperature=0.0, logprobs=2)


def compare(got, cold) -> dict:
    """Where two greedy answers part, the cold gap there, and the drift."""
    a, b = got.logprobs, cold.logprobs
    part = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x.chosen.token != y.chosen.token),
                None if len(a) == len(b) else min(len(a), len(b)))
    upto = len(b) if part is None else part
    drift = max((abs(x.chosen.logprob - y.chosen.logprob) for x, y in
                 zip(a[:upto], b[:upto], strict=True)),
                default=0.0)
    gap = None
    if part is not None and part < len(b) and len(b[part].top) > 1:
        gap = b[part].top[0].logprob - b[part].top[1].logprob
    return {"identical": part is None, "parts_at": part, "cold_gap_there": gap,
            "max_drift_before": drift}


def one_model(name: str, args) -> dict:
    rules, tools = agent_request(args.tokens)
    opts = dict(ctx_size=2 * args.tokens + 512, max_num_seqs=1, max_num_batched_tokens=512,
                flash_attn=False, threads=args.threads)
    def prompt(llm: LLM, run: int) -> list[int]:
        msgs = [{"role": "system", "content": system(rules, run)},
                {"role": "user", "content": QUESTIONS[run % len(QUESTIONS)]}]
        return llm.chat_tokens(msgs, tools if llm.template.supports_tools else None)
    cold = {}
    with LLM.load(name, LoadOptions(prefix_cache=False, **opts)) as llm:
        for run in range(1, args.runs + 1):
            t0 = time.perf_counter()
            cold[run] = (llm.complete(prompt(llm, run), GREEDY), time.perf_counter() - t0)
    rows = []
    with LLM.load(name, LoadOptions(prefix_cache_size_gb=0, move_cached_runs=args.min_run,
                                    **opts)) as llm:
        llm.complete(prompt(llm, 0), GREEDY)
        for run in range(1, args.runs + 1):
            t0 = time.perf_counter()
            got = llm.complete(prompt(llm, run), GREEDY)
            took = time.perf_counter() - t0
            ref, cold_s = cold[run]
            rows.append({"run": run, "prompt_tokens": got.usage.prompt_tokens,
                         "reused": got.usage.cached_tokens, "seconds": took,
                         "cold_seconds": cold_s, **compare(got, ref)})
    return {"rows": rows,
            "identical": sum(r["identical"] for r in rows), "of": len(rows),
            "max_drift_before_parting": max(r["max_drift_before"] for r in rows),
            "reused_share": sum(r["reused"] for r in rows) / sum(r["prompt_tokens"] for r in rows),
            "time_ratio": sum(r["seconds"] for r in rows) / sum(r["cold_seconds"] for r in rows)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="smollm2,qwen2.5-coder-0.5b")
    ap.add_argument("--runs", type=int, default=6)
    ap.add_argument("--min-run", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=1500)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    report = {"min_run": args.min_run, "tokens": args.tokens,
              **{m: one_model(m, args) for m in args.models.split(",")}}
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.exit(main())
