"""Prompt-lookup speculation: the draft proposer, the scheduler's adaptive
draft length, and exactness through the real engine: with `spec="ngram"`
greedy answers and their finish reasons are those of plain decoding, token
for token, and their logprobs agree closely."""

import random
import threading

import pytest
from near_tie import assert_same_until_near_tie, top_from_engine

from llmctl.runtime.engine.loop import propose_into
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.config import SpecConfig
from llmctl.runtime.speculation.ngram import NGRAM_MAX, NGRAM_MIN, NgramProposer, ngram_draft
from llmctl.store.resolve import ResolvedModel
from tests.conftest import smollm2_file

PROMPTS = [
    "Repeat this list exactly: apple, banana, cherry, date, elderberry, fig, grape, "
    "apple, banana, cherry, date, elderberry, fig, grape.",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\n"
    "Write def mul and def div in the same style.",
    "Correct the spelling and repeat the sentence: The quick brwn fox jumpd over the lazy dog "
    "and the quick brwn fox jumpd again.",
    "Name three colours.",
    "Count from one to twenty in words, separated by commas.",
    "Copy this JSON: {\"name\": \"Ada\", \"tags\": [\"math\", \"code\"], \"age\": 36}",
]


# ---- the proposer --------------------------------------------------------------------

def naive_draft(tokens: list[int], k: int) -> list[int]:
    for n in range(min(NGRAM_MAX, len(tokens) - 1), NGRAM_MIN - 1, -1):
        tail = tokens[-n:]
        for start in range(len(tokens) - n - 1, -1, -1):
            if tokens[start:start + n] == tail:
                follow = tokens[start + n:start + n + k]
                if follow:
                    return follow
    return []


def test_draft_follows_the_latest_longest_match():
    assert ngram_draft([1, 2, 3, 4, 5, 9, 9, 1, 2, 3], 4) == [4, 5, 9, 9]
    assert ngram_draft([5, 1, 2, 7, 1, 2, 8, 1, 2], 2) == [8, 1]
    assert ngram_draft([1, 2, 3], 3) == [] and ngram_draft([1, 2, 1, 2], 0) == []


def test_draft_matches_a_naive_search_on_random_text():
    rnd = random.Random(0)
    for _ in range(500):
        # Large ids too: their bytes can line up across token boundaries.
        vocab = rnd.choice([[1, 2, 3], [0, 256, 65536, 1 << 24], list(range(8))])
        tokens = [rnd.choice(vocab) for _ in range(rnd.randrange(0, 40))]
        k = rnd.randrange(0, 6)
        assert ngram_draft(tokens, k) == naive_draft(tokens, k), (tokens, k)


# ---- the scheduler -----------------------------------------------------------------

def decoding(s: Scheduler, n: int) -> list[Sequence]:
    seqs = []
    for _ in range(n):
        seq = Sequence(prompt=[7, 8, 9, 7, 8], params=SamplingParams(), max_new=100)
        s.add(seq)
        seqs.append(seq)
    for seq in s.admit():
        seq.n_computed = len(seq.prompt)
        seq.output.append(9)
        seq.status = Status.DECODING
    return seqs


@pytest.mark.parametrize("n_seqs,per_seq", [(1, 8), (2, 4), (3, 0), (8, 0), (16, 0)])
def test_the_draft_shrinks_as_the_batch_fills(n_seqs, per_seq):
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("ngram", 8, 1), tile=1))
    decoding(s, n_seqs)
    plan = s.schedule()
    propose_into(plan, NgramProposer())     # the engine fills the room the scheduler gave
    assert len(plan) == n_seqs
    # Every sequence's text is 7 8 9 7 8 9: the guess is 7 8 9 ... cut to the room.
    assert {len(w.draft) for w in plan} == {min(per_seq, 3)}


def test_a_sequence_whose_guesses_fail_checks_one_at_a_time():
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("draft", 8, 1), tile=1))
    seq, = decoding(s, 1)
    assert s.schedule()[0].room == 8
    s.record_spec(seq, 8, 0)
    assert s.schedule()[0].room == 1
    s.record_spec(seq, 1, 1)
    assert s.schedule()[0].room == 3
    s.record_spec(seq, 3, 3)
    assert s.schedule()[0].room == 7


def test_no_guesses_while_a_prompt_waits_to_be_computed():
    s = Scheduler(SchedulerConfig(4, 512, spec=SpecConfig("ngram"), tile=1))
    decoding(s, 1)
    s.add(Sequence(prompt=list(range(100)), params=SamplingParams(), max_new=8))
    s.admit()
    plan = s.schedule()
    propose_into(plan, NgramProposer())
    assert all(not w.draft for w in plan)


# ---- exactness through the engine ------------------------------------------------------

def load(spec: str | None, **kw) -> LLM:
    # Flash attention on: its kernel gives a checked row (one of several in
    # a step) the same logits as a lone decode row, for a sequence alone and
    # under 512 KV cells. Without it llama.cpp's attention sums them in
    # another order, and answers can drift (README: speculation).
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=1024),
               LoadOptions(max_num_seqs=4, threads=2, spec=spec, flash_attn=True, **kw))


def answers(llm: LLM, params_list, concurrent: bool = False):
    jobs = [(llm.chat_tokens([{"role": "user", "content": p}]), params)
            for p in PROMPTS for params in params_list]
    out: list = [None] * len(jobs)

    def run(i):
        c = llm.complete(*jobs[i])
        out[i] = (c.text, c.finish_reason, c.usage.completion_tokens, c.logprobs)

    if concurrent:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
    else:
        for i in range(len(jobs)):
            run(i)
    return out


PARAMS = [SamplingParams(temperature=0, max_tokens=80, logprobs=2),
          SamplingParams(temperature=0.9, seed=11, max_tokens=80),
          SamplingParams(temperature=0.7, seed=3, max_tokens=37, stop=("fig", "\n\n"))]


def same_as_plain(exactness, got: list, plain: list) -> None:
    """Answers with speculation against plain decoding's (answers() order):
    identical, logprobs included, where this machine's rows measure exact
    under flash attention; elsewhere a checked row may round differently
    from a lone one, so greedy answers agree up to the first near-tie and a
    seeded sample (whose draw can flip at any near-tie) only keeps its shape."""
    if exactness(flash_attn=True).exact:
        assert got == plain
        return
    params = [p for _ in PROMPTS for p in PARAMS]
    assert len(got) == len(plain) == len(params)
    for (text, reason, n, lps), ref, p in zip(got, plain, params, strict=False):
        assert text and reason in ("stop", "length") and 0 < n <= p.max_tokens
        if p.greedy and p.logprobs:
            assert_same_until_near_tie([lp.chosen.token for lp in ref[3]],
                                       [lp.chosen.token for lp in lps], top_from_engine(ref[3]))


@pytest.fixture(scope="module")
def plain():
    with load(None, prefix_cache=False) as llm:
        return answers(llm, PARAMS)


@pytest.mark.slow
def test_speculation_gives_exactly_plain_decoding(plain, exactness):
    with load("ngram", prefix_cache=False) as llm:
        same_as_plain(exactness, answers(llm, PARAMS), plain)
        stats = llm.stats()
    # It did speculate, and guessed right often enough to matter.
    assert stats.spec_steps > 0 and 0 < stats.spec_accepted <= stats.spec_drafted
    assert stats.spec_mean_accepted > 0.5


@pytest.mark.slow
def test_speculation_under_concurrency_with_the_prefix_cache_finishes_every_request(tmp_path,
                                                                            monkeypatch):
    # Under concurrency flash attention's logits depend on the company a
    # request keeps (scheduler.py), with or without speculation: this checks
    # the bookkeeping (KV trimmed, counts, parking), not bit-equality.
    monkeypatch.setenv("LLMCTL_HOME", str(tmp_path))
    with load("ngram") as llm:
        for concurrent in (True, False):
            got = answers(llm, PARAMS, concurrent=concurrent)
            assert all(text and reason in ("stop", "length") and 0 < n <= 80
                       for text, reason, n, _ in got)
        stats = llm.stats()
        assert stats.spec_accepted > 0
        assert stats.requests["ok"] == 2 * len(PROMPTS) * len(PARAMS)
