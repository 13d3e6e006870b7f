"""Cached runs moved past a prompt's first difference (prefix_cache/reuse.py,
runtime/llama/splice.py): the plan without a model, the slot table's
choice, then the real model in memory and from disk after a restart, with
answers held to the agreement bound docs/prefix-cache.md measured."""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
from near_tie import assert_same_until_near_tie, top_from_engine

from conftest import smollm2_file
from llmctl.errors import LlmctlError
from llmctl.runtime.engine.sequence import Sequence
from llmctl.runtime.engine.slots import SlotTable
from llmctl.runtime.llama.splice import restream
from llmctl.runtime.prefix_cache.reuse import SETTLE, plan
from llmctl.runtime.sampling import SamplingParams

# ---- the plan, no model ---------------------------------------------------------


def _check(have: list[int], prompt: list[int], prefix: int, min_run: int) -> None:
    got = plan(have, prompt, prefix, min_run)
    at_p = at_c = prefix
    for r in got.runs:
        assert have[r.src:r.src + r.n] == prompt[r.dst:r.dst + r.n]     # never a differing token
        assert r.n >= min_run and r.src >= at_c and r.dst >= at_p
        at_p, at_c = r.dst + r.n, r.src + r.n
    if got.runs:                            # the splice and the engine each compute one
        assert at_p <= len(prompt) - 2
    assert got.total == prefix + sum(r.n for r in got.runs)


def test_a_changed_line_keeps_what_follows_it():
    head, body = list(range(100, 140)), list(range(1000, 1600))
    have = head + [1, 2, 3] + body
    prompt = head + [7, 8, 9, 10, 11] + body + [5]
    got = plan(have, prompt, 40, 32)
    # The run's first SETTLE tokens are computed afresh after the new line.
    assert [(r.src, r.dst, r.n) for r in got.runs] == [(43 + SETTLE, 45 + SETTLE, 599 - SETTLE)]
    assert got.total == 40 + 599 - SETTLE
    assert plan(have, prompt, 40, 0).runs == ()          # 0 turns moving off
    shorter = head + [7] + body[:20] + [9] * 30
    assert plan(have, shorter, 40, 32).runs == ()        # no run as long as min_run


def test_random_edits_move_only_matching_runs():
    rng = random.Random(3)
    for _ in range(300):
        have = [rng.randrange(50) for _ in range(rng.randint(0, 400))]
        prompt = list(have)
        for _ in range(rng.randint(0, 4)):      # replace, insert or delete a span
            i = rng.randint(0, len(prompt))
            j = min(len(prompt), i + rng.randint(0, 20))
            prompt[i:j] = [rng.randrange(50) for _ in range(rng.randint(0, 20))]
        prefix = 0
        while prefix < min(len(have), len(prompt) - 1) and have[prefix] == prompt[prefix]:
            prefix += 1
        _check(have, prompt, prefix, rng.choice([8, 16, 32]))


def test_the_slot_table_prefers_the_slot_with_the_longest_runs():
    head, body = list(range(100, 110)), list(range(1000, 1400))
    table = SlotTable(3, min_share=16, tile=1, min_run=32)
    for tokens in (head + [1] + body, head + [5] * 400):
        s = Sequence(prompt=tokens, params=SamplingParams(), max_new=4)
        s.slot, _ = table.take(tokens)
        table.give_back(s, tokens)
    seq = Sequence(prompt=head + [9, 9] + body + [4], params=SamplingParams(), max_new=4)
    seq.slot, _ = table.take(seq.prompt)
    seq.kv_src = (seq.slot, 10)
    table.plan_prefix(seq, [seq])
    # not the last 2, nor the first SETTLE of the run (recomputed after the change)
    assert seq.moved is not None and seq.moved.total == 10 + 399 - SETTLE
    assert seq.kv_src == (seq.slot, 10)             # the slot it took is the one with the body
    off = SlotTable(3, min_share=4, tile=1)
    s = Sequence(prompt=head + [1] + body, params=SamplingParams(), max_new=4)
    s.slot, _ = off.take(s.prompt)
    off.give_back(s, s.prompt)
    seq.slot, _ = off.take(seq.prompt)
    off.plan_prefix(seq, [seq])
    assert seq.moved is None


def _state(counts: list[int], cells: bytes) -> bytes:
    """A sequence state as llama.cpp writes it: magic and seq id, the stream
    count, then each stream's cell count, followed by its cells if any."""
    out = [b"\xd8\x3c\x14\xaf", (2).to_bytes(4, "little"), len(counts).to_bytes(4, "little")]
    for n in counts:
        out.append(n.to_bytes(4, "little"))
        if n:
            out.append(cells)
    return b"".join(out)


def test_a_state_is_re_headed_for_the_other_contexts_stream_count():
    cells = bytes(range(1, 41))
    one = _state([5], cells)
    for i in range(4):             # the sequence's cells in any of 4 streams
        four = _state([5 if s == i else 0 for s in range(4)], cells)
        assert bytes(restream(four, 1)) == one
    assert bytes(restream(one, 4)) == _state([5, 0, 0, 0], cells)
    assert restream(one, 1) is one                       # the same count: untouched
    assert bytes(restream(_state([0, 0], b""), 1)) == _state([0], b"")
    with pytest.raises(LlmctlError):        # cells in two streams: not one sequence's
        restream(_state([5, 5], cells), 1)
    with pytest.raises(LlmctlError):
        restream(b"\xd8\x3c", 1)


# ---- the real model --------------------------------------------------------------

BODY = " ".join(f"Rule {i}: always read the file module_{i}.py before editing it, then run "
                "its tests." for i in range(60))
QUESTION = "Which file should I read before editing rule 7's module? Answer briefly."
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, logprobs=2)
# The bound docs/prefix-cache.md measured and chose: an answer after moved
# runs is the cold prefill's up to the first position where the cold run's
# two likeliest tokens were within BOUND nats (the largest gap a parting
# was seen at is a third of it), and no chosen token's log-probability
# before that moves by BOUND or more (the largest seen: under half of it).
BOUND = 0.5


def agent_prompt(cwd: str) -> str:
    return (f"<|im_start|>system\nYou are a coding agent.\nWorking directory: {cwd}\n{BODY}"
            f"<|im_end|>\n<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")


def load(home: Path, **opts):
    # Four slots by default, as a server has: the engine then keeps a KV
    # stream per slot, and the splice context one (splice.py's restream).
    os.environ["LLMCTL_HOME"] = str(home)
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.store.resolve import ResolvedModel

    base = dict(ctx_size=2048, max_num_seqs=4, max_num_batched_tokens=256, flash_attn=False)
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=2048),
               LoadOptions(**{**base, **opts}))


def ask(llm, cwd: str):
    return llm.complete(llm.text_tokens(agent_prompt(cwd)), GREEDY)


def agree(got, cold) -> None:
    ref = [lp.chosen.token for lp in cold.logprobs]
    part = assert_same_until_near_tie(ref, [lp.chosen.token for lp in got.logprobs],
                                      top_from_engine(cold.logprobs), bound=BOUND)
    upto = len(ref) if part is None else part
    drift = [abs(a.chosen.logprob - b.chosen.logprob)
             for a, b in zip(got.logprobs[:upto], cold.logprobs[:upto], strict=True)]
    assert max(drift, default=0.0) < BOUND


@pytest.fixture(scope="module")
def cold(tmp_path_factory):
    with load(tmp_path_factory.mktemp("cold"), prefix_cache=False) as llm:
        return ask(llm, "/home/me/project-b")


@pytest.mark.slow
@pytest.mark.parametrize("slots", [1, 4])
def test_a_changed_early_line_reuses_the_rest_in_memory(tmp_path, cold, slots):
    with load(tmp_path, prefix_cache_size_gb=0, move_cached_runs=64, max_num_seqs=slots) as llm:
        first = ask(llm, "/srv/a")
        assert first.usage.cached_tokens == 0
        got = ask(llm, "/home/me/project-b")
    n = got.usage.prompt_tokens
    assert got.usage.cached_tokens >= n - 40        # all but the changed line and the tail
    agree(got, cold)
    with load(tmp_path, prefix_cache_size_gb=0) as llm:     # moving off: the prefix only
        ask(llm, "/srv/a")
        assert ask(llm, "/home/me/project-b").usage.cached_tokens < 40


@pytest.mark.slow
def test_a_changed_early_line_reuses_the_rest_after_a_restart(tmp_path, cold):
    with load(tmp_path, move_cached_runs=64) as llm:
        ask(llm, "/srv/a")
        llm.prefix_cache.disk.flush()
    with load(tmp_path, move_cached_runs=64) as llm:
        got = ask(llm, "/home/me/project-b")
    assert got.usage.cached_tokens >= got.usage.prompt_tokens - 40
    agree(got, cold)
