#!/usr/bin/env python3
"""What `--spec auto` costs a single stream where it guesses little: the
same greedy request in process, plain decoding and auto alternating, with
the rows each run decoded and the time inside llama_decode, the
speculation hooks and the engine's steps.

    .venv/bin/python scripts/bench_spec_overhead.py [--model qwen2.5-coder-1.5b]
        [--tokens 96] [--rounds 3] [--threads N]

Each arm loads its own engine (a fresh process would be fairer still, and
is what scripts/bench_spec_auto.py does through `llmctl serve`).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time

from llmctl.runtime import llama
from llmctl.runtime.engine import loop as engine
from llmctl.runtime.engine import speculate
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.system import default_threads

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_step import _count_decodes, _timed  # noqa: E402

PROMPT = "Describe a walk through a forest in autumn, in three paragraphs."
TOTALS: dict[str, list] = {}     # name: [seconds, calls], as profile_step keeps them
DECODES: dict[str, int] = {}     # rows, graphs, calls: profile_step._count_decodes


def run(model: str, spec: str | None, tokens: int, threads: int) -> dict:
    opts = dataclasses.replace(LoadOptions(threads=threads, max_num_seqs=4), spec=spec)
    with LLM.load(model, opts) as llm:
        prompt = llm.chat_tokens([{"role": "user", "content": PROMPT}])
        llm.complete(prompt, SamplingParams(max_tokens=4))
        TOTALS.clear()
        DECODES.clear()
        start = time.perf_counter()
        llm.complete(prompt, SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True))
        return {"wall": time.perf_counter() - start, "rows": DECODES["rows"],
                **{name: seconds for name, (seconds, _) in TOTALS.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads())
    args = ap.parse_args()
    _count_decodes(DECODES)
    for owner, name in ((engine.Engine, "_step"), (llama.LlamaContext, "decode"),
                        (speculate.Speculation, "fill"), (speculate.Speculation, "timed")):
        _timed(owner, name, TOTALS)
    runs: dict[str, list[dict]] = {"off": [], "auto": []}
    for i in range(args.rounds):
        for arm, spec in (("off", None), ("auto", "auto")):
            runs[arm].append(run(args.model, spec, args.tokens, args.threads))
            r = runs[arm][-1]
            print(f"round {i + 1} {arm:4}: {r['rows']:.0f} rows, wall {r['wall']:.2f} s, "
                  f"llama_decode {r['decode']:.2f} s, speculation hooks "
                  f"{r.get('fill', 0) + r.get('timed', 0):.3f} s", flush=True)
    off, auto = (statistics.median(r["decode"] / r["rows"] for r in runs[a]) for a in ("off", "auto"))
    print(f"\nllama_decode per row, medians: off {off * 1e3:.1f} ms, auto {auto * 1e3:.1f} ms "
          f"(x{auto / off:.3f})")


if __name__ == "__main__":
    main()
