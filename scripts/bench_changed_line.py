#!/usr/bin/env python3
"""A coding agent's long system prompt with its date and working-directory
lines changed, against `llmctl serve` with its defaults (16 slots,
--move-cached-runs 64): in memory, and after a restart on the same cache.

The prompt: about --tokens tokens of rules and tools, its third line the
date and its fourth the working directory. Request A primes the server
(cold). B changes the date in place; C changes the date and the directory,
to one of another length; then the server restarts and D changes both
again. Each of B, C and D is also sent to a server with the prefix cache
off: its TTFT is the cold prefill the reuse is held against (reported as a
ratio), and its greedy answer is the one the reused prompt should give.

Usage: .venv/bin/python scripts/bench_changed_line.py [--model qwen2.5-coder-0.5b]
           [--tokens 4000] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile

from llmctl.bench.launcher import Server

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from bench_agent import agent_request, ask  # noqa: E402

CASES = {"A": ("2026-12-04", "/home/dev/app"),
         "B": ("2026-12-05", "/home/dev/app"),                      # the date, in place
         "C": ("2026-12-06", "/home/dev/another-project/src"),      # both, in length
         "D": ("2026-12-07", "/srv/x")}                             # both, after a restart
# The answer must read the changed lines, so a reused KV that missed them
# would show in the text, not only in the timing.
QUESTION = ("What is today's date, and what is the working directory? Then name the tool "
            "you would call first to read a file.")


def messages(rules: str, case: str) -> list[dict]:
    date, cwd = CASES[case]
    system = (f"You are a coding agent.\nUse the tools below.\nToday's date: {date}\n"
              f"Working directory: {cwd}\n{rules}")
    return [{"role": "system", "content": system}, {"role": "user", "content": QUESTION}]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=4000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rules, tools = agent_request(args.tokens)
    common = ["--threads", str(args.threads), "--ctx-size", str(args.tokens + 1024)]
    home, cold_home = tempfile.mkdtemp(prefix="llmctl-line-"), tempfile.mkdtemp(prefix="llmctl-cold-")

    def serve(where: str, *extra: str) -> Server:
        return Server.llmctl_serve(args.model, *common, *extra, env={"LLMCTL_HOME": where},
                                   startup_timeout=900)

    def one(url: str, case: str) -> dict:
        return ask(url, args.model, messages(rules, case), tools, max_tokens=48)

    got: dict[str, dict] = {}
    with serve(home) as srv:
        for case in "ABC":
            got[case] = one(srv.url, case)
    with serve(home) as srv:
        got["D"] = one(srv.url, "D")
    with serve(cold_home, "--no-prefix-cache") as srv:
        cold = {case: one(srv.url, case) for case in "BCD"}
    report: dict = {"model": args.model, "prompt_tokens": got["A"]["prompt_tokens"],
                    "cold_A_ttft_s": got["A"]["ttft"]}
    for case in "BCD":
        report[case] = {"where": "after a restart" if case == "D" else "in memory",
                        "cached": got[case]["cached"], "ttft_s": got[case]["ttft"],
                        "cold_ttft_s": cold[case]["ttft"],
                        "ttft_over_cold": got[case]["ttft"] / cold[case]["ttft"],
                        "answer_equals_cache_off": got[case]["text"] == cold[case]["text"],
                        "answer": got[case]["text"], "cache_off_answer": cold[case]["text"]}
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.exit(main())
