#!/usr/bin/env python3
"""Score candidate default models on twenty simple prompts (bench/simple_prompts.py).

    .venv/bin/python scripts/bench_default_model.py
    .venv/bin/python scripts/bench_default_model.py --models smollm2,qwen2.5-coder-1.5b --json

Each prompt is one chat turn at temperature 0, as `llmctl chat` sends it,
with up to 256 answer tokens. A model without a chat format (a base model)
scores nothing: chat refuses it. Reports each model's score, its failures,
its load time and its decode speed on this machine.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from llmctl.bench.simple_prompts import PROMPTS
from llmctl.errors import LlmctlError
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams

CANDIDATES = "smollm2,gemma3-270m,qwen2.5-coder-0.5b,qwen2.5-coder-1.5b"


def score(model: str, max_tokens: int) -> dict:
    """One model's answers to every prompt, and its figures. Raises
    LlmctlError when the model cannot be loaded."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens)
    started = time.monotonic()
    rows, decoded, decode_s = [], 0, 0.0
    with LLM.load(model, LoadOptions(ctx_size=2048, prefix_cache=False)) as llm:
        load_s = time.monotonic() - started
        for item in PROMPTS:
            try:
                tokens = llm.chat_tokens([{"role": "user", "content": item.prompt}])
            except LlmctlError as e:
                return {"model": model, "score": 0, "of": len(PROMPTS), "refused": e.message}
            done = llm.complete(tokens, params)
            decoded += done.usage.completion_tokens
            decode_s += max(done.duration_s - done.ttft_s, 1e-9)
            rows.append({"kind": item.kind, "prompt": item.prompt, "answer": done.text.strip(),
                         "ok": item.passes(done.text.strip())})
    return {"model": model, "score": sum(r["ok"] for r in rows), "of": len(PROMPTS),
            "load_s": round(load_s, 2), "decode_tok_s": round(decoded / decode_s, 1),
            "failures": [r for r in rows if not r["ok"]], "answers": rows}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=CANDIDATES, help=f"comma-separated (default {CANDIDATES})")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()
    results = []
    for model in args.models.split(","):
        try:
            results.append(score(model, args.max_tokens))
        except LlmctlError as e:
            results.append({"model": model, "score": None, "error": e.message})
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for r in results:
        if r.get("score") is None:
            print(f"{r['model']}: not scored: {r['error']}")
            continue
        extra = (f" (refused: {r['refused']})" if "refused" in r else
                 f", load {r['load_s']} s, {r['decode_tok_s']} tok/s")
        print(f"{r['model']}: {r['score']}/{r['of']}{extra}")
        for f in r.get("failures", []):
            print(f"    x {f['prompt']!r} -> {f['answer'][:100]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
