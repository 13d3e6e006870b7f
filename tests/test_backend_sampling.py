"""Backend sampling (--backend-sampling), through llama.cpp's CPU backend:
a request whose whole chain llama.cpp can run in its graph gets the same
answer as when sampled on the host; the others (a grammar, penalties,
logprobs) are sampled on the host, by name; and a backend-sampled sequence
never speculates (one output row per step)."""

from __future__ import annotations

import threading

import pytest

from conftest import smollm2_file
from llmctl.runtime.llama import backend_eligible
from llmctl.runtime.llm import LLM, LoadOptions
from llmctl.runtime.sampling import SamplingParams
from llmctl.store.resolve import ResolvedModel

PROMPTS = ["Tell me about cats.", "What is the capital of Italy?", "Write a haiku about rain.",
           "List three fruits."]


def _load(backend: bool, **opts) -> LLM:
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=1024),
               LoadOptions(max_num_seqs=4, max_num_batched_tokens=256, prefix_cache=False,
                           flash_attn=False, backend_sampling=backend, **opts))


@pytest.fixture(scope="module")
def pair(session_home):
    with _load(True) as on, _load(False) as off:
        yield on, off


def _together(llm: LLM, params: SamplingParams) -> list[str]:
    """The prompts' answers, generated in one batch."""
    out = [""] * len(PROMPTS)

    def one(i: int) -> None:
        tokens = llm.chat_tokens([{"role": "user", "content": PROMPTS[i]}])
        out[i] = llm.complete(tokens, params).text

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_the_chain_in_the_graph_gives_the_hosts_greedy_answers(pair):
    on, off = pair
    greedy = SamplingParams(temperature=0, max_tokens=24)
    assert on.engine.runner.backend_sampling and not off.engine.runner.backend_sampling
    assert _together(on, greedy) == _together(off, greedy)


def test_a_seeded_draw_in_the_graph_is_repeatable(pair):
    on, _ = pair
    seeded = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=7, max_tokens=24)
    first, again = _together(on, seeded), _together(on, seeded)
    assert first == again and len(set(first)) > 1


@pytest.mark.parametrize("params, eligible", [
    (SamplingParams(temperature=0), True),
    (SamplingParams(temperature=0.7, top_k=20, min_p=0.1, logit_bias=((42, -5.0),)), True),
    (SamplingParams(temperature=0, logprobs=2), False),
    (SamplingParams(temperature=0, repeat_penalty=1.1), False),
    (SamplingParams(temperature=0, presence_penalty=0.5), False),
    (SamplingParams(temperature=0, grammar='root ::= "yes" | "no"'), False),
])
def test_what_runs_in_the_graph(params, eligible):
    assert backend_eligible(params) is eligible


def test_requests_the_graph_cannot_sample_are_sampled_on_the_host(pair):
    on, off = pair
    tokens = on.chat_tokens([{"role": "user", "content": "Say yes or no."}])
    logged = SamplingParams(temperature=0, max_tokens=6, logprobs=3)
    got, want = on.complete(tokens, logged), off.complete(tokens, logged)
    assert got.text == want.text and len(got.logprobs) == len(want.logprobs) > 0
    assert got.logprobs == want.logprobs        # read from the raw logits, as on the host
    grammar = SamplingParams(temperature=0, max_tokens=4, grammar='root ::= "yes" | "no"')
    assert on.complete(tokens, grammar).text in ("yes", "no")


def test_a_sequence_sampled_in_the_graph_never_speculates(session_home):
    # --spec ngram guesses wherever the text repeats; a chain in the graph
    # samples one row a step, so its sequences take no guesses.
    repeat = "one two three four five six seven eight " * 6
    params = SamplingParams(temperature=0, max_tokens=40)
    with _load(True, spec="ngram") as on, _load(False, spec="ngram") as off:
        tokens = on.text_tokens("Repeat: " + repeat)
        assert on.complete(tokens, params).text == off.complete(tokens, params).text
        assert on.stats().spec_steps == 0 and off.stats().spec_steps > 0
