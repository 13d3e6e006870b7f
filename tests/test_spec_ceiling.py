"""scripts/bench_spec_ceiling.py's replay of an answer under each policy,
on hand-made token streams and a made-up step-cost curve (no model is
loaded): the ceilings order as their definitions say, and `--spec auto`'s
own controller, replayed, gains on a copy and never guesses where nothing
repeats."""

from __future__ import annotations

import math

import pytest

from conftest import script_module
from llmctl.runtime.speculation.adaptive import Controller

K = 8
# A step's cost by its rows, in tiers of four as ggml's CPU kernels take them.
COST = [0.0] + [1.0 + math.ceil((r - 1) / 4) for r in range(1, K + 2)]


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_spec_ceiling") as module:
        yield module


def speedups(bench, prompt, answer):
    out = {}
    for policy in bench.POLICIES:
        out[policy] = bench._rates(prompt, answer, COST, K, policy, 8, Controller())
    return out


def steps(bench, prompt, answer, policy):
    return bench.replay(prompt, answer, COST, K, policy, 8, Controller())[1]


def test_a_copied_answer_is_guessed_and_the_ceilings_order(bench):
    text = list(range(1000, 1300))
    prompt = [1, 2, *text, 3]
    got = speedups(bench, prompt, text)
    # the first token comes from the prompt's step; the rest in drafts of K
    assert steps(bench, prompt, text, "oracle") == math.ceil((len(text) - 1) / (K + 1))
    # every guess of a verbatim copy holds once two answer tokens match the
    # prompt: the n-gram ceiling is the oracle's but for one plain step
    assert steps(bench, prompt, text, "ngram-oracle") == steps(bench, prompt, text, "oracle") + 1
    assert got["lookup-oracle"][0] >= got["ngram-oracle"][0]
    # the threshold waits for an 8-token match before it checks anything
    assert steps(bench, prompt, text, "ngram-threshold") > steps(bench, prompt, text, "ngram-oracle")
    assert got["ngram-threshold"][0] > 1.5
    assert got["auto"][0] > 1.5


def test_checking_what_fails_costs_what_the_oracle_does_not(bench):
    # a copy that breaks every 6 tokens: the proposer's 8-token guesses hold
    # only in part, so checking all of them pays for rows that fail
    prompt, answer = [], []
    for i in range(30):
        prompt += [500 + i, 600 + i, 1, 2, 3, 4, 5, 6, 7, 8]
        answer += [500 + i, 600 + i, 1, 2, 3, 4, 900 + i]
    got = speedups(bench, prompt, answer)
    assert got["ngram-oracle"][0] > got["ngram-all"][0]
    assert got["ngram-oracle"][0] > 1.0


def test_nothing_repeats_nothing_is_guessed(bench):
    answer = list(range(5000, 5200))
    got = speedups(bench, [1, 2, 3], answer)
    assert got["oracle"][0] > 1.0
    for policy in ("lookup-oracle", "ngram-oracle", "ngram-all", "ngram-threshold", "auto"):
        assert got[policy] == (pytest.approx(1.0), pytest.approx(1.0))  # a token a step


def test_auto_stops_paying_for_guesses_that_always_fail(bench):
    # "7 8" recurs, each time followed by something new: the n-gram proposer
    # always guesses and is always wrong
    answer = []
    for i in range(60):
        answer += [7, 8, 100 + i]
    got = speedups(bench, [1], answer)
    assert got["ngram-oracle"][0] == pytest.approx(1.0)
    assert got["ngram-all"][0] < 0.85
    # auto probes, learns, and declines: near plain decoding, far above
    # checking every guess
    assert got["auto"][0] > 0.9
    assert got["auto"][0] > got["ngram-all"][0] + 0.2


def test_best_copy_looks_past_the_longest_match(bench):
    history = [5, 1, 2, 9, 5, 1, 3, 4, 5]
    answer = [1, 2, 9]
    # the nearest 5 goes on 1, 3: wrong after one; the first goes on 1, 2, 9
    assert bench._best_copy(history, answer, 0, 8) == 3
    assert bench.held([1, 3], answer, 0) == 1
