#!/usr/bin/env python3
"""How fast speculation could be on this machine, at best: the ceiling
that the step-cost curve and the n-gram proposer put on `--spec auto`,
task by task, for the held-out tasks (bench/spec_tasks.py).

Each task's greedy answer is generated once with plain decoding, in
process. The cost of a decode step of 1 to 1+K rows is then timed after a
200-token prompt, the counts interleaved round by round so that drift on a
shared machine spreads over all of them, and made monotone (a count costs
at most what any larger count was measured at). Replaying each answer
token by token after its first (which comes from the prompt's step), with
its prompt, gives these policies' steps, priced with that curve, against
plain decoding's one row a step:

- oracle: a proposer that always guesses the K next tokens right (the
  ceiling of any speculation with drafts of K);
- lookup, oracle: of every earlier occurrence of the last token, the one
  whose continuation holds longest, checking exactly what holds (the
  ceiling of any lookup proposer: one that copies what followed the last
  token somewhere in the prompt and output);
- ngram, oracle-checked: the n-gram proposer's guesses, checking exactly
  the ones that will hold (the ceiling of any controller over this
  proposer);
- ngram, all checked: every guess the proposer makes, up to K
  (`--spec ngram` without the cap that shrinks after a failed check, so
  it overstates what that mode's failures cost);
- ngram, threshold: the guesses checked only behind a match of at least
  --min-match tokens, up to K;
- auto, replayed: `--spec auto`'s own controller (speculation/adaptive.py)
  deciding each step's guesses, fed the curve's cost for each step it
  takes, one controller over all the tasks in turn, --rounds times, as a
  server's is (each task's median round).

What this leaves out, each of which only lowers what auto reaches: the
proposer's and sampler's time per step, and steps that need more than the
rows (the step's graph is split where sequences decode unequal rows).

    .venv/bin/python scripts/bench_spec_ceiling.py [--model qwen2.5-coder-0.5b]
        [--tokens 128] [--draft-max 16] [--min-match 8] [--repeat 9]
        [--rounds 3] [--threads N] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from llmctl.bench.spec_tasks import KINDS, TASKS
from llmctl.runtime.engine.events import FinishEvent, TokenEvent
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.llama.exactness import TEXT
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.adaptive import Candidate, Check, Controller, SeqSpec
from llmctl.runtime.speculation.ngram import ngram_guess
from llmctl.runtime.system import default_threads
from llmctl.store.resolve import resolve_model

CONTEXT = 200


def answers(model: str, tokens: int, threads: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, greedy answer tokens) per task, plain decoding.
    The tokens are read from their logprobs: an event per released text
    would miss the tokens whose bytes were held back."""
    out = []
    opts = LoadOptions(threads=threads, flash_attn=True, prefix_cache=False, spec=None)
    params = SamplingParams(temperature=0, max_tokens=tokens, logprobs=0)
    with LLM.load(model, opts) as llm:
        for _, _, text in TASKS:
            prompt = llm.chat_tokens([{"role": "user", "content": text}])
            got = [lp.chosen.token for e in llm.stream(prompt, params)
                   if isinstance(e, TokenEvent | FinishEvent) for lp in e.logprobs]
            out.append((prompt, got))
    return out


def step_costs(model: str, threads: int, most: int, repeat: int) -> list[float]:
    """Seconds of a decode step of r rows, for r in 0..most (index 0
    unused), monotone: each count at most any larger count's median."""
    m = LlamaModel(resolve_model(model).path)
    ctx = LlamaContext(m, ContextConfig(n_ctx_seq=1024, n_seq_max=1, n_batch=512,
                                        n_threads=threads, flash_attn=True))
    try:
        toks = m.tokenize(TEXT, add_special=False)
        while len(toks) < CONTEXT + most:
            toks += toks
        ctx.prefill(0, toks[:CONTEXT])
        times: dict[int, list[float]] = {r: [] for r in range(1, most + 1)}
        order = list(times)
        for _ in range(repeat):
            random.shuffle(order)
            for r in order:
                t = time.perf_counter()
                ctx.decode([(0, toks[CONTEXT:CONTEXT + r], CONTEXT, r)])
                times[r].append(time.perf_counter() - t)
                ctx.seq_rm(0, CONTEXT, -1)
    finally:
        ctx.close()
        m.close()
    cost = [0.0] + [statistics.median(times[r]) for r in range(1, most + 1)]
    for r in range(most - 1, 0, -1):
        cost[r] = min(cost[r], cost[r + 1])
    return cost


def held(guess: list[int], answer: list[int], at: int) -> int:
    """How many of `guess` equal the answer from `at` on."""
    n = 0
    while n < len(guess) and at + n < len(answer) and guess[n] == answer[at + n]:
        n += 1
    return n


def replay(prompt: list[int], answer: list[int], cost: list[float], k: int,
           policy: str, min_match: int, controller: Controller) -> tuple[float, int]:
    """Seconds a policy takes over the answer after its first token (the
    prompt's step gives that one), and its steps."""
    seconds, steps, at = 0.0, 0, 1
    record = SeqSpec()
    while at < len(answer):
        room = min(k, len(answer) - at - 1)     # as the scheduler allows: none past the end
        history = prompt + answer[:at]
        if policy == "auto":
            checked, kept = _auto_step(controller, record, history, answer, at, room, cost)
        elif policy == "oracle":
            checked = kept = room
        elif policy == "lookup-oracle":
            checked = kept = _best_copy(history, answer, at, room)
        else:
            g = ngram_guess(history, room)
            kept = held(g.tokens, answer, at)
            if policy == "ngram-oracle":
                checked = kept
            elif policy == "ngram-threshold" and g.match < min_match:
                checked = kept = 0
            else:
                checked = len(g.tokens)
        seconds += cost[1 + checked]
        steps += 1
        at += kept + 1
    return seconds, steps


def _best_copy(history: list[int], answer: list[int], at: int, k: int) -> int:
    """The most of the answer from `at` that any earlier occurrence of the
    history's last token continues with, up to `k`."""
    last, best = history[-1], 0
    for i in range(len(history) - 1):
        if history[i] == last:
            best = max(best, held(history[i + 1:i + 1 + k], answer, at))
    return best


def _auto_step(controller: Controller, record: SeqSpec, history: list[int], answer: list[int],
               at: int, room: int, cost: list[float]) -> tuple[int, int]:
    """One step of a lone sequence under the auto controller: (guesses
    checked, guesses kept), the controller taught as the engine teaches it."""
    record.sync(history, [])
    g = ngram_guess(history, room) if room > 0 else None
    checked = kept = 0
    if g and g.tokens:
        c = Candidate(record, g.tokens, g.match)
        checked = controller.trim(1, [c])[0]
        if checked:
            kept = held(c.guesses[:checked], answer, at)
            controller.record(record, c.kind, checked, kept)
            controller.settle(1, cost[1 + checked], [Check(record, checked, kept)])
    controller.costs.record(1 + checked, cost[1 + checked])
    return checked, kept


POLICIES = ("oracle", "lookup-oracle", "ngram-oracle", "ngram-all", "ngram-threshold", "auto")


def measure_tasks(tasks: list[tuple[list[int], list[int]]], cost: list[float], k: int,
                  min_match: int, rounds: int) -> list[dict]:
    """Per task, each policy's speed-up over plain decoding and tokens per
    step. Auto replays the tasks `rounds` times in turn on one controller,
    as a server's learns from every request before, and reports each
    task's median round; the other policies learn nothing."""
    controller = Controller()
    auto: list[list[tuple[float, float]]] = [[] for _ in tasks]
    for _ in range(rounds):
        for i, (prompt, answer) in enumerate(tasks):
            auto[i].append(_rates(prompt, answer, cost, k, "auto", min_match, controller))
    out = []
    for (kind, name, _), (prompt, answer), runs in zip(TASKS, tasks, auto, strict=True):
        row: dict = {"kind": kind, "task": name, "tokens": len(answer)}
        for p in POLICIES:
            rate = (sorted(runs)[len(runs) // 2] if p == "auto"
                    else _rates(prompt, answer, cost, k, p, min_match, controller))
            row[p], row[p + "_tokens_per_step"] = rate
        out.append(row)
    return out


def _rates(prompt: list[int], answer: list[int], cost: list[float], k: int, policy: str,
           min_match: int, controller: Controller) -> tuple[float, float]:
    """(speed-up over plain decoding, tokens per step) of one replay."""
    seconds, steps = replay(prompt, answer, cost, k, policy, min_match, controller)
    n = len(answer) - 1
    return n * cost[1] / seconds if seconds else 1.0, n / max(1, steps)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-0.5b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--draft-max", type=int, default=16)
    ap.add_argument("--min-match", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--threads", type=int, default=default_threads())
    ap.add_argument("--rounds", type=int, default=3,
                    help="times the tasks are replayed under auto, on one controller")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.rounds < 1 or args.draft_max < 1 or args.repeat < 1:
        ap.error("--rounds, --draft-max and --repeat must be at least 1")
    k = args.draft_max
    cost = step_costs(args.model, args.threads, k + 1, args.repeat)
    rows = measure_tasks(answers(args.model, args.tokens, args.threads), cost, k,
                         args.min_match, args.rounds)
    if args.json:
        print(json.dumps({"cost_ms": [round(1e3 * c, 2) for c in cost[1:]], "tasks": rows}))
        return
    print(f"{args.model}, {args.threads} threads, drafts of up to {k}; step ms by rows: "
          + ", ".join(f"{r}:{1e3 * cost[r]:.0f}" for r in range(1, k + 2)))
    print("speed-up over plain decoding (--json adds tokens per step)")
    print(f"{'task':26} {'tok':>4} " + " ".join(f"{p:>15}" for p in POLICIES))
    for r in rows:
        print(f"{r['kind'] + ': ' + r['task']:26} {r['tokens']:>4} "
              + " ".join(f"{r[p]:>15.2f}" for p in POLICIES))
    for kind in KINDS:
        of = [r for r in rows if r["kind"] == kind]
        print(f"{'median ' + kind:31} " + " ".join(f"{statistics.median(r[p] for r in of):>15.2f}"
                                                   for p in POLICIES))


if __name__ == "__main__":
    main()
