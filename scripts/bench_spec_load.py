#!/usr/bin/env python3
"""What `--spec auto` costs a full batch, with the process's luck left out:
one engine, loaded once, runs the same concurrent requests with auto on
and with speculation off, switched between runs, arms interleaved and
reversed every other round, and an A/A pair of `off` runs beside them.

Through `llmctl serve` each arm is its own process, and on a 2-vCPU VM
two processes of one build differ by several percent for their whole
life; here the weights, buffers and threads are the same for every arm,
so what is left between auto and off is auto's own work: its proposals,
its pricing and its checks. The machine still drifts by several percent
within minutes, so the time inside speculation's hooks is reported too: it
is auto's cost without the drift.

    .venv/bin/python scripts/bench_spec_load.py [--model smollm2]
        [--levels 4,16] [--output-tokens 128] [--rounds 3] [--flash-attn on|off]

Workload as scripts/bench_serve.py's: unique ~130-token prompts, greedy,
`ignore_eos`, twice as many requests as the concurrency. Every arm of a
round gets the same prompts, with the prefix cache off so that none of
them is a hit.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor

from llmctl.bench.prompts import _words
from llmctl.runtime.engine import loop as engine
from llmctl.runtime.engine import speculate
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.spec_config import SpecConfig
from llmctl.runtime.system import default_threads

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from profile_step import _timed  # noqa: E402

ARMS = ("auto", "off", "off again")
PROMPT_TOKENS = 130
TOTALS: dict[str, list] = {}     # name: [seconds, calls], as profile_step keeps them
# What is timed: a step, and speculation's two hooks in it.
TIMED = ((engine.Engine, "_step"), (speculate.Speculation, "fill"),
         (speculate.Speculation, "learn"))


def install_timers() -> None:
    """Wrap each of TIMED to add its time to TOTALS."""
    for owner, name in TIMED:
        _timed(owner, name, TOTALS)


def prompts(llm: LLM, n: int, seed: int) -> list[list[int]]:
    """`n` unique chat prompts of about PROMPT_TOKENS tokens."""
    out = []
    for i in range(n):
        rng = random.Random(f"{seed}-{i}")
        words = _words(rng, PROMPT_TOKENS)
        tokens = llm.chat_tokens([{"role": "user", "content": f"Note {i}: {words}"}])
        while len(tokens) > PROMPT_TOKENS and " " in words:
            words = words.rsplit(" ", 1)[0]
            tokens = llm.chat_tokens([{"role": "user", "content": f"Note {i}: {words}"}])
        out.append(tokens)
    return out


class Switch:
    """Turns the loaded engine's speculation on (as loaded, auto) and off
    between runs, as `--spec off` would have built it: no proposer, and a
    scheduler that gives no room for guesses. Only while the engine is
    idle."""

    def __init__(self, llm: LLM):
        self.engine = llm.engine
        self.on = (self.engine.spec, self.engine.scheduler.cfg)
        self.off = (None, dataclasses.replace(self.engine.scheduler.cfg, spec=SpecConfig()))

    def set(self, arm: str) -> None:
        self.engine.spec, self.engine.scheduler.cfg = self.on if arm == "auto" else self.off


def run(llm: LLM, batch: list[list[int]], concurrency: int, out_tokens: int) -> dict:
    """The batch at `concurrency`: generated tok/s, and auto's counters."""
    params = SamplingParams(temperature=0, max_tokens=out_tokens, ignore_eos=True)
    stats = llm.engine.scheduler.collector
    before = (stats.spec_steps, stats.spec_declined)
    TOTALS.clear()
    start = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        done = list(pool.map(lambda p: llm.complete(p, params), batch))
    wall = time.perf_counter() - start
    hooks = sum(TOTALS.get(name, [0.0])[0] for name in ("fill", "learn"))
    return {"tok_s": sum(c.usage.completion_tokens for c in done) / wall,
            "texts": [c.text for c in done], "steps": TOTALS["_step"][1],
            "step_s": TOTALS["_step"][0], "hooks_s": hooks,
            "spec_steps": stats.spec_steps - before[0],
            "declined": stats.spec_declined - before[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--levels", default="4,16", help="Concurrencies, e.g. 4,16.")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--flash-attn", choices=("on", "off"), default=None,
                    help="Attention mode (default: serve's).")
    args = ap.parse_args()
    install_timers()
    levels = [int(x) for x in args.levels.split(",") if x]
    fa = None if args.flash_attn is None else args.flash_attn == "on"
    opts = LoadOptions(threads=args.threads, max_num_seqs=max(levels), flash_attn=fa,
                       ctx_size=max(levels) * 512, spec="auto", prefix_cache=False)
    with LLM.load(args.model, opts) as llm:
        switch = Switch(llm)
        llm.complete(llm.chat_tokens([{"role": "user", "content": "Hi"}]),
                     SamplingParams(max_tokens=4))
        for c in levels:
            runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            for i in range(args.rounds):
                batch = prompts(llm, 2 * c, i)
                for arm in ARMS if i % 2 == 0 else reversed(ARMS):
                    switch.set(arm)
                    runs[arm].append(run(llm, batch, c, args.output_tokens))
                    r = runs[arm][-1]
                    print(f"c={c} round {i + 1} {arm:9}: {r['tok_s']:.1f} tok/s, {r['steps']} "
                          f"steps of {1e3 * r['step_s'] / r['steps']:.2f} ms, speculation's "
                          f"hooks {1e3 * r['hooks_s'] / r['steps']:.3f} ms a step", flush=True)
            report(c, runs)


def report(c: int, runs: dict[str, list[dict]]) -> None:
    def ratios(a: str, b: str) -> list[float]:
        return [x["tok_s"] / y["tok_s"] for x, y in zip(runs[a], runs[b], strict=True)]

    tok = {arm: statistics.median(r["tok_s"] for r in runs[arm]) for arm in ARMS}
    for label, (a, b) in (("auto / off", ("auto", "off")), ("A/A", ("off again", "off"))):
        each = ratios(a, b)
        print(f"c={c} {label}: x{statistics.median(each):.3f} "
              f"({', '.join(f'{r:.3f}' for r in each)})")
    print(f"c={c} tok/s medians: " + ", ".join(f"{a} {t:.1f}" for a, t in tok.items())
          + f"; auto checked {sum(r['spec_steps'] for r in runs['auto'])} steps, declined "
          f"{sum(r['declined'] for r in runs['auto'])} proposals", flush=True)
    auto = runs["auto"]
    same = sum(a == b for x, y in zip(auto, runs["off"], strict=True)
               for a, b in zip(x["texts"], y["texts"], strict=True))
    print(f"c={c} auto's texts equal to off's: {same} of {sum(len(x['texts']) for x in auto)}")
    share = sum(r["hooks_s"] for r in auto) / sum(r["step_s"] for r in auto)
    print(f"c={c} auto's own work (proposing, pricing, learning): {share:.2%} of its steps' "
          f"time, {1e3 * sum(r['hooks_s'] for r in auto) / sum(r['steps'] for r in auto):.3f} "
          f"ms a step", flush=True)


if __name__ == "__main__":
    main()
