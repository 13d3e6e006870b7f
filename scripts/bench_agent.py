#!/usr/bin/env python3
"""An agent-shaped conversation against `llmctl serve` and llama-server
--jinja on the same GGUF, side by side in one run.

A coding agent's request: a system prompt plus tools of about --tokens
tokens, with a short line near its start that differs per run (a working
directory and a time), then the conversation. Six turns, each from a new
HTTP client, each resending everything before it; then the agent starts
again in a new process (a new working directory and time) against a
restarted server on the same cache directory, and sends its turn 1.

Reported per server: TTFT of turn 1, of turns 2-6, and of turn 1 after the
restart, with the prompt tokens the server said it reused; and for llmctl
the restarted turn's answer against a cold prefill of the same request.

Each --variant NAME='FLAGS' adds an llmctl arm with those serve flags
(e.g. off='--flash-attn off'), run right after the default arm, with its
ratio to it.

Usage: .venv/bin/python scripts/bench_agent.py [--model qwen2.5-coder-0.5b]
           [--tokens 8000] [--threads 2] [--variant NAME='FLAGS'] [--skip-peers] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from llmctl.bench.client import sse_chunks
from llmctl.bench.launcher import Server, variant

LLAMA_SERVER = Path("/tmp/llama-server-build/bin/llama-server")
WORDS = ("file test module edit read run check branch commit patch diff build lint "
         "type error path line function class import return value config").split()
QUESTIONS = ["List the files you would read first.", "Which test should run after an edit?",
             "Name one risk of editing the config.", "What does the lint step check?",
             "Summarise the rules in one sentence.", "Which tool reads a file?"]


def words(n: int, seed: int) -> str:
    rnd = random.Random(seed)
    return " ".join(rnd.choice(WORDS) for _ in range(n))


def agent_request(n_tokens: int) -> tuple[str, list[dict]]:
    """(the system prompt's body, the tools): about n_tokens in all."""
    tools = [{"type": "function", "function": {
        "name": f"tool_{i}", "description": words(60, 100 + i),
        "parameters": {"type": "object", "properties": {
            "path": {"type": "string", "description": words(12, 200 + i)},
            "limit": {"type": "integer", "minimum": 0, "maximum": 2**53 - 1}},
            "required": ["path"]}}} for i in range(12)]
    rules = "\n".join(f"Rule {i}: " + words(20, i) for i in range(max(1, (n_tokens - 1300) // 24)))
    return rules, tools


def system(rules: str, run: int) -> str:
    # The line an agent changes per run, near the top (Claude Code and
    # Codex both put the working directory and the date there).
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(1_780_000_000 + 3_600 * run))
    return (f"You are a coding agent.\nWorking directory: /home/dev/project-{run}/src\n"
            f"Time: {when}\n{rules}")


def ask(url: str, model: str, messages: list[dict], tools: list[dict],
        max_tokens: int = 16) -> dict:
    """One turn from a new client: TTFT, the reply, the reused prompt tokens."""
    body = {"model": model, "messages": messages, "tools": tools, "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, text, usage, cache_n = None, "", {}, None
    with httpx.Client(timeout=3600) as client, \
            client.stream("POST", url + "/v1/chat/completions", json=body) as r:
        r.raise_for_status()
        for chunk in sse_chunks(r.iter_lines()):
            usage = chunk.get("usage") or usage
            cache_n = (chunk.get("timings") or {}).get("cache_n", cache_n)
            for choice in chunk.get("choices", []):
                delta = choice.get("delta", {})
                if delta.get("content") or delta.get("tool_calls"):
                    ttft = ttft or time.perf_counter() - t0
                    text += delta.get("content") or ""
    # llama-server reports its reuse as timings.cache_n, not in usage.
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", cache_n)
    return {"ttft": ttft or time.perf_counter() - t0, "text": text,
            "prompt_tokens": usage.get("prompt_tokens"), "cached": cached}


def conversation(url: str, model: str, rules: str, tools: list[dict], run: int,
                 turns: int) -> list[dict]:
    messages = [{"role": "system", "content": system(rules, run)}]
    out = []
    for i in range(turns):
        messages.append({"role": "user", "content": QUESTIONS[i % len(QUESTIONS)]})
        got = ask(url, model, messages, tools)
        messages.append({"role": "assistant", "content": got["text"] or "OK."})
        out.append(got)
    return out


def measure(start, url_model: str, rules: str, tools: list[dict]) -> dict:
    with start() as srv:
        turns = conversation(srv.url, url_model, rules, tools, run=1, turns=6)
    with start() as srv:                    # a new agent process, a restarted server
        again = conversation(srv.url, url_model, rules, tools, run=2, turns=1)[0]
    t1, rest = turns[0]["ttft"], [t["ttft"] for t in turns[1:]]
    return {"turn1_s": t1, "turns2_6_s": rest, "turns2_6_median_s": statistics.median(rest),
            "restart_turn1_s": again["ttft"], "turns2_6_ratio": max(rest) / t1,
            "restart_ratio": again["ttft"] / t1,
            "prompt_tokens": [t["prompt_tokens"] for t in turns] + [again["prompt_tokens"]],
            "cached": [t["cached"] for t in turns] + [again["cached"]],
            "restart_answer": again["text"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=8000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=16384)
    ap.add_argument("--variant", action="append", default=[], help="NAME='SERVE FLAGS'")
    ap.add_argument("--skip-peers", action="store_true", help="no llama-server arm")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from llmctl.store.resolve import resolve_model

    path = str(resolve_model(args.model).path)
    rules, tools = agent_request(args.tokens)
    home = tempfile.mkdtemp(prefix="llmctl-agent-")
    common = ["--ctx-size", str(args.ctx), "--max-num-seqs", "1", "--threads", str(args.threads)]
    report: dict = {"model": args.model}

    def llmctl(extra: list[str], where: str):
        return lambda: Server.llmctl_serve(args.model, *common, *extra,
                                           env={"LLMCTL_HOME": where}, startup_timeout=900)

    report["llmctl"] = measure(llmctl([], home), args.model, rules, tools)
    for label, flags in map(variant, args.variant):
        arm = measure(llmctl(flags, tempfile.mkdtemp(prefix=f"llmctl-{label}-")),
                      args.model, rules, tools)
        report[f"llmctl {label}"] = arm
        for key in ("turn1_s", "turns2_6_median_s", "restart_turn1_s"):
            report[f"{key}_llmctl_over_{label}"] = report["llmctl"][key] / arm[key]
    cold_home = tempfile.mkdtemp(prefix="llmctl-cold-")
    with llmctl(["--no-prefix-cache"], cold_home)() as srv:
        cold = conversation(srv.url, args.model, rules, tools, run=2, turns=1)[0]
    report["llmctl"]["cold_restart_answer"] = cold["text"]
    report["llmctl"]["restart_answer_agrees"] = cold["text"] == report["llmctl"]["restart_answer"]
    if LLAMA_SERVER.exists() and not args.skip_peers:
        def llama():
            return Server([str(LLAMA_SERVER), "-m", path, "--jinja", "-np", "1",
                           "-c", str(args.ctx), "--threads", str(args.threads), "--no-webui",
                           "--cache-reuse", "256"], startup_timeout=900)
        report["llama-server"] = measure(llama, args.model, rules, tools)
        for key in ("turn1_s", "turns2_6_median_s", "restart_turn1_s"):
            report[f"{key}_llmctl_over_llama_server"] = (
                report["llmctl"][key] / report["llama-server"][key])
    print(json.dumps(report, indent=None if args.json else 2))


if __name__ == "__main__":
    sys.exit(main())
