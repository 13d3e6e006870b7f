#!/usr/bin/env python3
"""Python-level work per generated token, counted exactly: every function
call (Python and C) in all threads during one greedy completion. Unlike a
timing, the count does not move with machine noise, so two trees compare
by it exactly (run this script under each tree's interpreter).

    .venv/bin/python scripts/count_calls.py [--tokens 128] [--top 0]
"""

from __future__ import annotations

import argparse
import collections
import sys
import threading

ON = [False]
COUNTS: collections.Counter[str] = collections.Counter()


def _profile(frame, event, arg) -> None:
    if not ON[0]:
        return
    if event == "call":
        COUNTS[f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_code.co_name}"] += 1
    elif event == "c_call":
        COUNTS[f"C:{getattr(arg, '__qualname__', arg)}"] += 1


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--top", type=int, default=0, help="Also list the most called functions.")
    args = ap.parse_args()
    # Set before the engine thread starts, so that thread is profiled too.
    threading.setprofile(_profile)
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.runtime.sampling import SamplingParams

    with LLM.load("smollm2", LoadOptions(ctx_size=1024, threads=2)) as llm:
        tokens = llm.text_tokens("Write a long story about a lighthouse keeper and a storm.")
        params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
        llm.complete(tokens, params)            # warm-up: first-call set-up is not counted
        ON[0] = True
        sys.setprofile(_profile)
        done = llm.complete(tokens, params)
        sys.setprofile(None)
        ON[0] = False
    n = done.usage.completion_tokens
    total = sum(COUNTS.values())
    print(f"{total} calls for {n} tokens: {total / n:.1f} a token")
    for name, count in COUNTS.most_common(args.top):
        print(f"{count:8} {name}")


if __name__ == "__main__":
    main()
