#!/usr/bin/env python3
"""KV-cache quantization (--kv-type f16|q8_0|q4_0), side by side in one run:

1. KV memory at 16 slots of 4,096 tokens per type, as llama.cpp itself
   allocates it (its "llama_kv_cache: size" report for a real context of
   that shape), beside the planner's estimate; and how many 4,096-token
   slots fit their KV in 1 GB (from the measured bytes per slot).
2. Quality against f16, over N prompts x M tokens of f16's greedy answer:
   teacher-forced greedy agreement (fed the same tokens, how often the
   type's top token equals f16's), the mean length of the free-running
   greedy answer that stays identical to f16's, and perplexity of a fixed
   text (llama-perplexity's windows, each scored on its second half).
3. Aggregate decode tokens/s at concurrency 16 per type, in-process through
   LLM, rounds alternating between types so machine noise hits all; the
   ratio to f16 (target for q8_0: >= 0.9x).

    .venv/bin/python scripts/bench_kv_quant.py [--model smollm2|qwen2.5-coder-0.5b]
        [--prompts 8] [--agree-tokens 32] [--ppl-chunks 8] [--tokens 128] [--rounds 3]
        [--threads N] [--n-gpu-layers auto] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from importlib import resources

import numpy as np

from llmctl.runtime.engine.events import TokenEvent
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.planner import ModelShape
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.system import default_threads
from llmctl.store.gguf_info import KV_TYPES, read_gguf_info
from llmctl.store.resolve import resolve_model

SLOTS, SLOT_TOKENS, BUDGET = 16, 4096, 1 << 30
PPL_CTX = 512
PROMPTS = ["Explain how a bicycle gear works.", "Write a short poem about the sea.",
           "List three uses of a paperclip.", "What is the capital of Japan, and why?",
           "Describe a cat to someone who has never seen one.", "Give advice for a job interview.",
           "Summarise the plot of Romeo and Juliet.", "How do vaccines train the immune system?",
           "Write a Python function that reverses a string.", "Why do leaves change colour?",
           "Compare tea and coffee.", "Tell a story about a lost key."]


def kv_memory(model: LlamaModel, info, threads: int) -> dict[str, dict]:
    """Per type: KV bytes llama.cpp allocates for SLOTS x SLOT_TOKENS (a real
    context, no decode), the planner's estimate, and slots per BUDGET."""
    rows = {}
    for kv in KV_TYPES:
        ctx = LlamaContext(model, ContextConfig(n_ctx_seq=SLOT_TOKENS, n_seq_max=SLOTS, n_batch=512,
                                                n_threads=threads, kv_type=kv))
        measured = ctx.kv_bytes
        ctx.close()
        planned = ModelShape.from_info(info, kv).kv_bytes(SLOTS * SLOT_TOKENS)
        per_slot = (measured or planned) / SLOTS
        rows[kv] = {"measured_bytes": measured, "planner_bytes": planned,
                    "slots_in_1gib": int(BUDGET // per_slot)}
    return rows


def perplexity(model: LlamaModel, tokens: list[int], kv: str, threads: int, chunks: int) -> float:
    """llama-perplexity's figure on `tokens` with a `kv` cache: windows of
    PPL_CTX, each scored on its second half."""
    from llmctl.quantize.perplexity import _window_nll

    ctx = LlamaContext(model, ContextConfig(n_ctx_seq=PPL_CTX, n_seq_max=1, n_batch=PPL_CTX,
                                            n_threads=threads, n_ubatch=PPL_CTX, kv_type=kv))
    try:
        nll = []
        for i in range(min(chunks, len(tokens) // PPL_CTX)):
            window = tokens[i * PPL_CTX:(i + 1) * PPL_CTX]
            if model.add_bos:
                window[0] = model.bos
            nll.append(_window_nll(ctx, window, PPL_CTX // 2))
    finally:
        ctx.close()
    return math.exp(float(np.concatenate(nll).mean()))


def greedy_tokens(llm: LLM, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Each prompt's greedy continuation of exactly n tokens, one request at
    a time (a batch's composition must not differ between types)."""
    params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
    return [[e.token for e in llm.stream(tokens, params) if isinstance(e, TokenEvent)]
            for tokens in prompts]


def forced_top1(model: LlamaModel, seqs: list[tuple[list[int], list[int]]], kv: str,
                threads: int) -> list[np.ndarray]:
    """Per (prompt, answer): the top token a `kv` cache predicts at each
    answer position, fed the answer itself (teacher forcing)."""
    n = max(len(p) + len(a) for p, a in seqs)
    ctx = LlamaContext(model, ContextConfig(n_ctx_seq=n, n_seq_max=1, n_batch=n,
                                            n_threads=threads, kv_type=kv))
    try:
        out = []
        for prompt, answer in seqs:
            ctx.clear()
            rows = ctx.decode_rows(prompt + answer, len(prompt) - 1)[:-1]
            out.append(rows.argmax(axis=1))
    finally:
        ctx.close()
    return out


def agreement(model: LlamaModel, prompts: list[list[int]], greedy: dict[str, list[list[int]]],
              threads: int) -> dict[str, dict]:
    """Per type: teacher-forced top-1 agreement with f16 on f16's answers,
    and the mean identical start of its own greedy answer."""
    seqs = list(zip(prompts, greedy["f16"], strict=False))
    top = {kv: np.concatenate(forced_top1(model, seqs, kv, threads)) for kv in greedy}
    out = {}
    for kv, answers in greedy.items():
        prefixes = [next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), len(a))
                    for a, b in zip(greedy["f16"], answers, strict=False)]
        out[kv] = {"forced_agreement": float((top[kv] == top["f16"]).mean()),
                   "mean_identical_prefix": statistics.mean(prefixes)}
    return out


def one_round(llm: LLM, jobs: list[list[int]], tokens: int) -> float:
    """Generated tokens per second of wall time for len(jobs) concurrent requests."""
    params = SamplingParams(seed=1, max_tokens=tokens, ignore_eos=True)
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        done = list(pool.map(lambda t: llm.complete(t, params), jobs))
    return sum(c.usage.completion_tokens for c in done) / (time.perf_counter() - start)


def load_all(args) -> dict[str, LLM]:
    llms = {}
    for kv in KV_TYPES:
        opts = LoadOptions(max_num_seqs=SLOTS, ctx_size=args.tokens + 128, threads=args.threads,
                           n_gpu_layers=args.n_gpu_layers, prefix_cache=False, kv_type=kv,
                           max_num_batched_tokens=512)
        llms[kv] = LLM.load(args.model, opts)
    return llms


def quality_and_speed(args, llms: dict[str, LLM]) -> tuple[dict, dict]:
    ref_llm = llms["f16"]
    prompts = [ref_llm.chat_tokens([{"role": "user", "content": p}])
               for p in (PROMPTS * 4)[:args.prompts]]
    greedy = {kv: greedy_tokens(llm, prompts, args.agree_tokens) for kv, llm in llms.items()}
    quality = agreement(ref_llm.model, prompts, greedy, args.threads or default_threads())
    jobs = [ref_llm.chat_tokens([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
            for i in range(SLOTS)]
    for llm in llms.values():
        one_round(llm, jobs[:2], 8)         # warm-up
    rates: dict[str, list[float]] = {kv: [] for kv in llms}
    for r in range(args.rounds):
        # Alternate the order too, so no type always runs first in a round.
        order = list(llms) if r % 2 == 0 else list(reversed(llms))
        for kv in order:
            rates[kv].append(one_round(llms[kv], jobs, args.tokens))
    speed = {kv: {"tok_per_s": statistics.median(v), "ratio_to_f16": statistics.median(v)
                  / statistics.median(rates["f16"])} for kv, v in rates.items()}
    return quality, speed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--agree-tokens", type=int, default=32)
    ap.add_argument("--ppl-chunks", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128, help="tokens per request in the speed test")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--n-gpu-layers", default="auto")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    threads = args.threads or default_threads()

    resolved = resolve_model(args.model)
    info = read_gguf_info(resolved.path)
    llms = load_all(args)
    try:
        model = llms["f16"].model          # weights shared by the raw contexts below
        memory = kv_memory(model, info, threads)
        text = resources.files("llmctl.quantize").joinpath("data/eval-text.txt").read_text()
        tokens = model.tokenize(text, add_special=True, parse_special=False)
        ppl = {kv: perplexity(model, tokens, kv, threads, args.ppl_chunks) for kv in KV_TYPES}
        quality, speed = quality_and_speed(args, llms)
    finally:
        for llm in llms.values():
            llm.close()
    report(args, memory, ppl, quality, speed)


def report(args, memory: dict, ppl: dict, quality: dict, speed: dict) -> None:
    rows = {kv: {**memory[kv], "perplexity": ppl[kv], **quality[kv], **speed[kv]} for kv in memory}
    if args.json:
        print(json.dumps({"model": args.model, "slots": SLOTS, "slot_tokens": SLOT_TOKENS,
                          "budget_bytes": BUDGET, "kv_bytes_source": "llama.cpp log (planner beside)",
                          "agree_prompts": args.prompts, "agree_tokens": args.agree_tokens,
                          "ppl_ctx": PPL_CTX, "concurrency": SLOTS, "tokens": args.tokens,
                          "rounds": args.rounds, "types": rows}, indent=2))
        return
    mib = 1 << 20
    print(f"model {args.model}")
    print(f"  KV: {SLOTS} slots x {SLOT_TOKENS} tokens, llama.cpp's allocation [planner's estimate]")
    print(f"  quality vs f16: {args.prompts} prompts x {args.agree_tokens} tokens; agree = "
          "teacher-forced top-1, prefix = identical greedy start; perplexity at ctx "
          f"{PPL_CTX}")
    print(f"  speed: concurrency {SLOTS}, {args.tokens} tokens each, median of {args.rounds} rounds")
    print(f"{'type':<5} {'KV MiB':>18} {'saved':>6} {'slots/1GiB':>10} {'agree':>6} {'prefix':>6} "
          f"{'ppl':>7} {'tok/s':>8} {'vs f16':>6}")
    base = rows["f16"]["measured_bytes"] or rows["f16"]["planner_bytes"]
    for kv, r in rows.items():
        got = r["measured_bytes"] or r["planner_bytes"]
        print(f"{kv:<5} {got / mib:>8.1f} [{r['planner_bytes'] / mib:>7.1f}] {1 - got / base:>6.0%} "
              f"{r['slots_in_1gib']:>10} {r['forced_agreement']:>6.1%} {r['mean_identical_prefix']:>6.1f} "
              f"{r['perplexity']:>7.3f} {r['tok_per_s']:>8.1f} {r['ratio_to_f16']:>5.2f}x")


if __name__ == "__main__":
    main()
