#!/usr/bin/env python3
"""Single-stream generation speed: `llmctl run` against a tight llama_decode
loop over the same library, same model, same threads, in one run.

The tight loop is the ceiling: one greedy sampler, one token per decode,
nothing else. Rounds alternate between the two so machine noise hits both.

    .venv/bin/python scripts/bench_single_stream.py [--tokens 128] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "Write a long story about a lighthouse keeper and a storm."


def tight_loop(path: Path, n_tokens: int, threads: int) -> float:
    """Decode tokens/s of the bare C API: prompt, then sample+decode n times."""
    import llama_cpp as lc

    from llmctl.runtime.llama import init_backend

    init_backend()
    mparams = lc.llama_model_default_params()
    model = lc.llama_model_load_from_file(str(path).encode(), mparams)
    vocab = lc.llama_model_get_vocab(model)
    cparams = lc.llama_context_default_params()
    cparams.n_ctx, cparams.n_batch, cparams.n_seq_max = 1024, 512, 1
    cparams.n_threads = cparams.n_threads_batch = threads
    ctx = lc.llama_init_from_model(model, cparams)
    text = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n".encode()
    buf = (lc.llama_token * 256)()
    n = lc.llama_tokenize(vocab, text, len(text), buf, 256, False, True)
    smpl = lc.llama_sampler_chain_init(lc.llama_sampler_chain_default_params())
    lc.llama_sampler_chain_add(smpl, lc.llama_sampler_init_greedy())
    lc.llama_decode(ctx, lc.llama_batch_get_one(buf, n))
    tok = (lc.llama_token * 1)()
    tok[0] = lc.llama_sampler_sample(smpl, ctx, -1)
    start = time.perf_counter()
    for _ in range(n_tokens - 1):
        lc.llama_decode(ctx, lc.llama_batch_get_one(tok, 1))
        tok[0] = lc.llama_sampler_sample(smpl, ctx, -1)
    elapsed = time.perf_counter() - start
    lc.llama_sampler_free(smpl)
    lc.llama_free(ctx)
    lc.llama_model_free(model)
    return (n_tokens - 1) / elapsed


def llmctl_run(n_tokens: int, threads: int) -> float:
    """tokens/s as `llmctl run --json` reports it (first token to last)."""
    out = subprocess.run(
        [sys.executable, "-m", "llmctl", "run", "smollm2", PROMPT, "--json", "--temperature", "0",
         "--max-tokens", str(n_tokens), "--threads", str(threads), "--ctx-size", "1024"],
        capture_output=True, text=True, check=True).stdout
    data = json.loads(out)
    return data["tokens_per_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    from llmctl.runtime.system import default_threads

    threads = args.threads or default_threads()
    ceiling, ours = [], []
    for i in range(args.rounds):
        # Fresh processes for both, so neither inherits the other's warm state.
        c = float(subprocess.run([sys.executable, __file__, "--_tight", str(args.tokens),
                                  str(threads)], capture_output=True, text=True,
                                 check=True).stdout)
        o = llmctl_run(args.tokens, threads)
        ceiling.append(c)
        ours.append(o)
        print(f"round {i + 1}: tight loop {c:6.1f} tok/s   llmctl run {o:6.1f} tok/s   ratio {o / c:.3f}")
    c, o = statistics.median(ceiling), statistics.median(ours)
    # Each round's pair ran back to back, so its ratio cancels slow drifts in
    # machine load; the median of those ratios is the figure to quote.
    ratio = statistics.median(x / y for x, y in zip(ours, ceiling, strict=False))
    print(f"\nmedian over {args.rounds} rounds, {args.tokens} tokens, {threads} threads:")
    print(f"  tight llama_decode loop  {c:6.1f} tok/s  (ceiling)")
    print(f"  llmctl run               {o:6.1f} tok/s")
    print(f"  median per-round ratio   {ratio:.3f} of ceiling")


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--_tight":
        from llmctl.store.resolve import resolve_model

        print(tight_loop(resolve_model("smollm2").path, int(sys.argv[2]), int(sys.argv[3])))
    else:
        main()
