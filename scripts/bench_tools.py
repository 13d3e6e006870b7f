#!/usr/bin/env python3
"""Tool calls and JSON-schema answers, side by side in one run: `llmctl
serve` against llama.cpp's `llama-server --jinja` on the same GGUF, same
threads, similar slots, same prompts through the official openai client
(temperature 0, a fixed seed per prompt).

Workload: tool-call prompts over four tools (nested objects, enums, arrays,
required fields) with tool_choice "auto", "required" and a named function;
and json_schema (strict) response formats. A tool answer is valid when
finish_reason is "tool_calls", every call names one of the tools (the named
one when named) and its arguments parse and validate against the tool's
parameters with `jsonschema`; a schema answer when its content parses and
validates. A request a server rejects counts as invalid, its error kept.
Each server runs every prompt at concurrency 1, then at 4 (a thread pool);
tok/s is the sum of usage.completion_tokens over the pass's wall time.
Servers run one after another (never both at once), so each has the whole
machine. Target: llmctl 100% valid, tok/s >= 0.95x llama-server's.

    .venv/bin/python scripts/bench_tools.py [--model qwen2.5-coder-0.5b] [--rounds 3]
        [--threads 2] [--llama-server PATH] [--skip-peers] [--limit N] [--json]

llama-server is looked for at $LLAMA_SERVER or /tmp/llama-server-build/bin/.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import jsonschema
import openai

from llmctl.bench.launcher import Server
from llmctl.store.resolve import resolve_model

CTX_PER_SEQ = 2048
SLOTS = 4
OURS = "llmctl serve"
PEER = "llama-server --jinja"


def _fn(name: str, description: str, parameters: dict) -> dict:
    return {"type": "function",
            "function": {"name": name, "description": description, "parameters": parameters}}


TOOLS = {t["function"]["name"]: t for t in [
    _fn("get_weather", "Current weather in a city", {
        "type": "object", "required": ["city"], "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}}),
    _fn("create_event", "Put an event in the calendar", {
        "type": "object", "required": ["title", "start"], "properties": {
            "title": {"type": "string"},
            "start": {"type": "object", "required": ["date"], "properties": {
                "date": {"type": "string", "description": "YYYY-MM-DD"},
                "time": {"type": "string", "description": "HH:MM"}}},
            "attendees": {"type": "array", "items": {"type": "string"}},
            "priority": {"type": "string", "enum": ["low", "normal", "high"]}}}),
    _fn("search_products", "Search the shop's catalogue", {
        "type": "object", "required": ["query"], "properties": {
            "query": {"type": "string"},
            "filters": {"type": "object", "properties": {
                "max_price": {"type": "number"},
                "categories": {"type": "array", "items": {
                    "type": "string", "enum": ["books", "music", "garden", "toys"]}}}},
            "limit": {"type": "integer"}}}),
    _fn("send_email", "Send an email", {
        "type": "object", "required": ["to", "subject", "body"], "properties": {
            "to": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "subject": {"type": "string"}, "body": {"type": "string"},
            "urgent": {"type": "boolean"}}}),
]}

# (prompt, tool_choice: "auto", "required" or a tool name to force), the
# modes interleaved so that --limit 3 still has one of each.
TOOL_CASES = [
    ("What's the weather in Paris right now, in celsius?", "auto"),
    ("Put 'Team lunch' on 2025-03-14 at 12:30 with Ana and Li, high priority.", "required"),
    ("Tell alice@example.com and carol@example.com the meeting moved to 3pm.", "send_email"),
    ("Find me gardening books under 20 dollars, at most 5 results.", "auto"),
    ("Is it raining in Tokyo?", "required"),
    ("Dentist appointment on 2025-06-02.", "create_event"),
    ("Email bob@example.com that the build is green. Subject: CI.", "auto"),
    ("Look for wooden toys and music boxes.", "required"),
    ("Berlin, fahrenheit please.", "get_weather"),
    ("cheap garden hoses", "search_products"),
]

_PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "email"],
           "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                          "email": {"type": "string"}}}
# (prompt, schema)
SCHEMA_CASES = [
    ("Describe a fictional person.", _PERSON),
    ("Give a recipe for pancakes.", {
        "type": "object", "required": ["title", "ingredients", "steps"], "properties": {
            "title": {"type": "string"},
            # Bounded: a 0.5B model otherwise lists ingredients until max_tokens.
            "ingredients": {"type": "array", "minItems": 2, "maxItems": 6, "items": {
                "type": "object", "required": ["item", "quantity"], "properties": {
                    "item": {"type": "string", "maxLength": 40},
                    "quantity": {"type": "string", "maxLength": 20}}}},
            "steps": {"type": "array", "maxItems": 5,
                      "items": {"type": "string", "maxLength": 120}}}}),
    ("Classify the sentiment of: 'The service was slow but the food was great.'", {
        "type": "object", "required": ["sentiment", "confidence"], "properties": {
            "sentiment": {"type": "string", "enum": ["positive", "negative", "mixed"]},
            "confidence": {"type": "number"}}}),
    ("Extract the address from: 'Ship to 221B Baker Street, London NW1 6XE, UK.'", {
        "type": "object", "required": ["street", "city", "postcode", "country"],
        "properties": {k: {"type": "string"} for k in ("street", "city", "postcode", "country")}}),
    ("List three prime numbers and whether each is even.", {
        "type": "array", "minItems": 3, "maxItems": 3, "items": {
            "type": "object", "required": ["n", "even"], "properties": {
                "n": {"type": "integer"}, "even": {"type": "boolean"}}}}),
    ("A todo list with two items for moving house.", {
        "type": "object", "required": ["todos"], "properties": {"todos": {
            "type": "array", "maxItems": 4,
            "items": {"type": "object", "required": ["task", "done"],
                      "properties": {"task": {"type": "string"}, "done": {"type": "boolean"}}}}}}),
    ("Translate 'good morning' into French and Spanish.", {
        "type": "object", "required": ["fr", "es"], "additionalProperties": False,
        "properties": {"fr": {"type": "string"}, "es": {"type": "string"}}}),
    ("A book recommendation for a 10-year-old.", {
        "type": "object", "required": ["title", "author", "genre"], "properties": {
            "title": {"type": "string", "maxLength": 80}, "author": {"type": "string"},
            "genre": {"type": "string", "enum": ["adventure", "fantasy", "mystery", "science"]},
            "year": {"type": ["integer", "null"]}}}),
    ("A small team: a lead and two members.", {
        "type": "object", "required": ["lead", "members"], "properties": {
            "lead": _PERSON, "members": {"type": "array", "maxItems": 3, "items": _PERSON}}}),
    ("The HTTP status for 'not found', as code and reason.", {
        "type": "object", "required": ["code", "reason"], "properties": {
            "code": {"type": "integer"}, "reason": {"type": "string"},
            "retry": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}}),
]


@dataclass(frozen=True)
class Case:
    """One request: its category (tools:auto|required|named, or schema),
    the create() keyword arguments, and how to judge the answer."""

    kind: str
    kwargs: dict
    check: Callable[[object], str | None]


def tool_call_problem(resp, choice: str) -> str | None:
    """Why a chat completion is not a valid tool call for tool_choice
    CHOICE ("auto", "required" or a tool name), or None when it is."""
    c = resp.choices[0]
    if c.finish_reason != "tool_calls":
        return f"finish_reason {c.finish_reason!r}: {(c.message.content or '')[:80]!r}"
    if not c.message.tool_calls:
        return "finish_reason tool_calls without tool_calls"
    for call in c.message.tool_calls:
        name = call.function.name
        if name not in TOOLS or choice not in ("auto", "required", name):
            return f"call to {name!r}"
        try:
            args = json.loads(call.function.arguments)
        except (TypeError, ValueError):
            return f"arguments are not JSON: {call.function.arguments!r}"
        problem = _schema_problem(args, TOOLS[name]["function"]["parameters"])
        if problem:
            return f"{name}: {problem}"
    return None


def schema_problem(resp, schema: dict) -> str | None:
    """Why a chat completion's content is not JSON valid under SCHEMA, or
    None when it is."""
    content = resp.choices[0].message.content
    try:
        value = json.loads(content or "")
    except ValueError:
        return f"not JSON ({resp.choices[0].finish_reason}): {(content or '')[:80]!r}"
    return _schema_problem(value, schema)


def _schema_problem(value, schema: dict) -> str | None:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as e:
        return f"invalid: {e.message[:100]}"
    return None


def cases(model: str, limit: int | None = None) -> list[Case]:
    """Every request of one pass, the first LIMIT of each list when given."""
    out = []
    for i, (prompt, choice) in enumerate(TOOL_CASES[:limit]):
        tool_choice = choice if choice in ("auto", "required") else {
            "type": "function", "function": {"name": choice}}
        kind = "tools:" + (choice if choice in ("auto", "required") else "named")
        out.append(Case(kind, _request(model, prompt, 100 + i, max_tokens=160,
                                       tools=list(TOOLS.values()), tool_choice=tool_choice),
                        partial(tool_call_problem, choice=choice)))
    for i, (prompt, schema) in enumerate(SCHEMA_CASES[:limit]):
        fmt = {"type": "json_schema",
               "json_schema": {"name": f"answer{i}", "schema": schema, "strict": True}}
        out.append(Case("schema", _request(model, prompt, 200 + i, max_tokens=400,
                                           response_format=fmt),
                        partial(schema_problem, schema=schema)))
    return out


def _request(model: str, prompt: str, seed: int, **kw) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}],
            "temperature": 0, "seed": seed, **kw}


def run_one(client: openai.OpenAI, case: Case) -> dict:
    """One request: its category, validity, completion tokens and the
    reason it is invalid (a rejected request's error included)."""
    start = time.perf_counter()
    try:
        resp = client.chat.completions.create(**case.kwargs)
    except openai.APIError as e:
        out = {"kind": case.kind, "valid": False, "tokens": 0,
               "problem": f"{type(e).__name__}: {str(e)[:200]}"}
    else:
        problem = case.check(resp)
        out = {"kind": case.kind, "valid": problem is None,
               "tokens": resp.usage.completion_tokens if resp.usage else 0, "problem": problem}
    out["seconds"] = round(time.perf_counter() - start, 2)
    # Progress on stderr: a full run takes a while on a small CPU.
    print(f"   {out['kind']:15} {'ok ' if out['valid'] else 'BAD'} {out['tokens']:4} tokens "
          f"{out['seconds']:6.1f}s {out['problem'] or ''}"[:160], file=sys.stderr, flush=True)
    return out


def run_pass(client: openai.OpenAI, work: list[Case], concurrency: int) -> dict:
    """All of WORK at CONCURRENCY: completion tok/s over the wall time, and
    each request's outcome."""
    start = time.perf_counter()
    pool = ThreadPoolExecutor(max_workers=concurrency)
    try:
        done = list(pool.map(partial(run_one, client), work))
    finally:
        # Interrupted (SIGTERM, Ctrl-C): don't wait for requests in flight,
        # so the caller stops the server now; that ends them.
        pool.shutdown(wait=False, cancel_futures=True)
    wall = time.perf_counter() - start
    return {"tok_s": sum(d["tokens"] for d in done) / wall, "wall_s": wall, "requests": done}


def servers(model: str, threads: int, llama_server: Path | None) -> dict[str, Callable[[], Server]]:
    """Each server to measure, as a factory (a port is picked at start)."""
    out = {OURS: partial(Server.llmctl_serve, model, "--max-num-seqs", str(SLOTS),
                         "--ctx-size", str(CTX_PER_SEQ), "--threads", str(threads))}
    if llama_server is not None:
        gguf = str(resolve_model(model).path)
        out[PEER] = partial(Server, [str(llama_server), "-m", gguf, "--jinja",
                                     "-np", str(SLOTS), "-c", str(SLOTS * CTX_PER_SEQ),
                                     "-t", str(threads), "-tb", str(threads),
                                     "--host", "127.0.0.1", "--no-webui"])
    return out


def measure(url: str, work: list[Case]) -> dict:
    client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=900)
    run_one(client, work[0])  # warm-up: first-request costs are not throughput
    return {f"c{c}": run_pass(client, work, c) for c in (1, SLOTS)}


def summarize(runs: list[dict]) -> dict:
    """Over rounds: valid/total per category (every request of every pass),
    median tok/s per pass, and the distinct problems seen."""
    valid: dict[str, list[int]] = {}
    problems: dict[str, int] = {}
    for run in runs:
        for p in run.values():
            for r in p["requests"]:
                v = valid.setdefault(r["kind"], [0, 0])
                v[0] += r["valid"]
                v[1] += 1
                if r["problem"]:
                    key = f"{r['kind']}: {r['problem']}"
                    problems[key] = problems.get(key, 0) + 1
    tok_s = {p: statistics.median(run[p]["tok_s"] for run in runs) for p in runs[0]}
    return {"valid": {k: {"valid": a, "total": b, "share": a / b} for k, (a, b) in sorted(valid.items())},
            "tok_s": tok_s, "problems": problems}


def report(results: dict[str, dict], rounds: int) -> None:
    names = list(results)
    print(f"\nvalid answers (all passes, {rounds} round(s)); tok/s: median over rounds")
    print(f"{'':22}" + "".join(f"{n:>24}" for n in names))
    for kind in results[names[0]]["valid"]:
        cells = []
        for n in names:
            v = results[n]["valid"].get(kind)
            cells.append(f"{v['valid']}/{v['total']} ({v['share']:.0%})" if v else "-")
        print(f"{'valid ' + kind:22}" + "".join(f"{c:>24}" for c in cells))
    for p in results[names[0]]["tok_s"]:
        print(f"{'tok/s ' + p:22}" + "".join(f"{results[n]['tok_s'][p]:>24.1f}" for n in names))
    if PEER in results:
        for p, ours in results[OURS]["tok_s"].items():
            print(f"llmctl/llama-server tok/s at {p}: x{ours / results[PEER]['tok_s'][p]:.2f}")
    for n in names:
        for problem, count in results[n]["problems"].items():
            print(f"  {n}: {count}x {problem}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-server", type=Path, default=Path(
        os.environ.get("LLAMA_SERVER", "/tmp/llama-server-build/bin/llama-server")))
    ap.add_argument("--skip-peers", action="store_true")
    ap.add_argument("--limit", type=int, default=None,
                    help="Only the first N tool and N schema prompts (a quick check).")
    ap.add_argument("--json", action="store_true", help="Print one JSON object instead.")
    args = ap.parse_args()
    # On SIGTERM (timeout, kill) unwind, so the server running now is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    peer = None if args.skip_peers or not args.llama_server.exists() else args.llama_server
    work = cases(args.model, args.limit)
    runs: dict[str, list[dict]] = {}
    for i in range(args.rounds):
        for name, server in servers(args.model, args.threads, peer).items():
            print(f"== round {i + 1}: {name}", file=sys.stderr, flush=True)
            with server() as srv:
                runs.setdefault(name, []).append(measure(srv.url, work))
    results = {name: summarize(r) for name, r in runs.items()}
    if args.json:
        print(json.dumps({"model": args.model, "threads": args.threads, "rounds": args.rounds,
                          "requests_per_pass": len(work), "results": results}, indent=2))
        return
    report(results, args.rounds)


if __name__ == "__main__":
    main()
