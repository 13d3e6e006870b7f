"""Prompt-lookup speculation: the proposer, the scheduler's guess budget,
and exactness through the real engine: with `spec="ngram"`
greedy answers and their finish reasons are those of plain decoding, token
for token, and their logprobs agree closely."""

import random
import threading
from array import array

import pytest
from near_tie import assert_same_until_near_tie, top_from_engine

from llmctl.runtime.engine.plan import Sampled, StepResult
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.engine.speculate import Records, propose_into
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.ngram import CANDIDATES, MATCH_MAX, NGRAM_MIN, NgramProposer, ngram_guess
from llmctl.runtime.speculation.spec_config import SpecConfig
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

def naive_guess(tokens: list[int], k: int) -> tuple[list[int], int]:
    """The longest-match rule, spelled out: among the CANDIDATES latest
    earlier occurrences of the last NGRAM_MIN tokens that leave a token
    after them, the one whose match reaches furthest back (the latest among
    equals), with that match's length capped at MATCH_MAX."""
    if k <= 0 or len(tokens) <= NGRAM_MIN:
        return [], 0
    n, best, seen = len(tokens), (-1, 0), 0
    for start in range(n - NGRAM_MIN - 1, -1, -1):
        if tokens[start:start + NGRAM_MIN] != tokens[-NGRAM_MIN:]:
            continue
        seen += 1
        follow = start + NGRAM_MIN
        length = NGRAM_MIN
        while length < min(MATCH_MAX, follow) and tokens[follow - length - 1] == tokens[n - length - 1]:
            length += 1
        if length > best[1]:
            best = (follow, length)
        if seen == CANDIDATES or best[1] >= MATCH_MAX:
            break
    if best[0] < 0:
        return [], 0
    return tokens[best[0]:best[0] + k], best[1]


def test_a_guess_follows_the_longest_match_with_its_length():
    g = ngram_guess([1, 2, 3, 4, 5, 9, 9, 1, 2, 3], 4)
    assert (g.tokens, g.match) == ([4, 5, 9, 9], 3)
    # 7 1 2 matches three tokens back, the later 8 1 2 only two.
    g = ngram_guess([7, 1, 2, 5, 8, 1, 2, 6, 7, 1, 2], 2)
    assert (g.tokens, g.match) == ([5, 8], 3)
    assert ngram_guess([1, 2, 3], 3).tokens == [] and ngram_guess([1, 2, 1, 2], 0).tokens == []


def test_guesses_match_a_naive_search_on_random_text():
    rnd = random.Random(0)
    for _ in range(800):
        # Large ids too: their bytes can line up across token boundaries.
        vocab = rnd.choice([[1, 2, 3], [0, 256, 65536, 1 << 24], list(range(8)), [5]])
        tokens = [rnd.choice(vocab) for _ in range(rnd.randrange(0, 120))]
        k = rnd.randrange(0, 6)
        g = ngram_guess(tokens, k)
        assert (g.tokens, g.match if g.tokens else 0) == naive_guess(tokens, k), (tokens, k)
        assert ngram_guess(array("i", tokens), k) == g     # the engine's running history


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
    # The engine fills the room the scheduler gave.
    work, _ = propose_into(list(plan), NgramProposer(), Records())
    assert len(work) == n_seqs
    # Every sequence's text is 7 8 9 7 8 9: the guess is 7 8 9 ... cut to the room.
    assert {len(w.draft) for w in work} == {min(per_seq, 3)}


def test_a_sequence_whose_guesses_fail_checks_one_at_a_time():
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("draft", 8, 1), tile=1))
    seq, = decoding(s, 1)

    def checked(kept: int) -> int:
        """The room of the next step after a check of which `kept` held."""
        plan = s.schedule()
        result = StepResult()
        r = result.of(seq)
        r.computed, r.drafted = 1, plan[0].room
        r.sampled = [Sampled(5, b"x", False)] * (kept + 1)
        s.update(plan, result)
        return s.schedule()[0].room

    assert s.schedule()[0].room == 8
    assert [checked(0), checked(1), checked(3)] == [1, 3, 7]


def test_no_guesses_while_a_prompt_waits_to_be_computed():
    s = Scheduler(SchedulerConfig(4, 512, spec=SpecConfig("ngram"), tile=1))
    decoding(s, 1)
    s.add(Sequence(prompt=list(range(100)), params=SamplingParams(), max_new=8))
    s.admit()
    work, _ = propose_into(list(s.schedule()), NgramProposer(), Records())
    assert all(not w.draft for w in work)


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
