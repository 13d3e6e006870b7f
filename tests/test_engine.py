"""The engine with the real model: batching must not change greedy output,
and cancelled or finished sequences must free their slots."""

import queue
import threading
import time

import pytest
from near_tie import assert_completions_agree

from llmctl.errors import ContextOverflow, InvalidParams, QueueFull
from llmctl.runtime.engine.events import ErrorEvent, FinishEvent, TokenEvent
from llmctl.runtime.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=24)
PROMPTS = ["Tell me about cats.", "What is the capital of Italy?", "Write a haiku about rain.",
           "Explain gravity simply.", "List three fruits.", "Who wrote Hamlet?",
           "How do planes fly?", "Give me a fun fact."]


def answer(llm, prompt, params=GREEDY):
    return llm.complete(llm.chat_tokens([{"role": "user", "content": prompt}]), params)


def test_batched_greedy_equals_each_alone(llm, exactness):
    # Identical where this machine's rows are exact (the `llm` fixture keeps
    # no prefix cache, so flash attention is on), else up to a near-tie.
    logged = SamplingParams(temperature=0, max_tokens=24, logprobs=5)
    alone = [answer(llm, p, logged) for p in PROMPTS]
    results = [None] * len(PROMPTS)

    def worker(i):
        results[i] = answer(llm, PROMPTS[i], logged)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for before, after in zip(alone, results, strict=False):
        assert_completions_agree(exactness(flash_attn=llm.engine.flash_attn), before, after)
    assert len({c.text for c in alone}) > 1      # the prompts really differ


def test_new_request_joins_a_running_batch(llm):
    """A request arriving mid-generation gets its first token long before the
    running one finishes: it joined the batch instead of queueing behind it."""
    long_params = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
    events: queue.SimpleQueue = queue.SimpleQueue()
    first = llm.engine.submit(llm.text_tokens("Once upon a time"), long_params, events.put)
    while events.get() and not first.output:
        pass
    late = answer(llm, "Hi", SamplingParams(temperature=0, max_tokens=4))
    assert late.usage.completion_tokens >= 1
    assert first.finished_at is None          # still running when the late one finished
    llm.engine.cancel(first)
    while not isinstance(events.get(), FinishEvent):
        pass


def test_stop_strings_and_max_tokens(llm):
    full = answer(llm, "Count from 1 to 10, separated by commas.",
                  SamplingParams(temperature=0, max_tokens=40)).text
    assert "," in full
    stop_at = full[full.index(","):][:2]
    cut = answer(llm, "Count from 1 to 10, separated by commas.",
                 SamplingParams(temperature=0, max_tokens=40, stop=(stop_at,)))
    assert cut.finish_reason == "stop" and stop_at not in cut.text
    assert full.startswith(cut.text)
    short = answer(llm, "Count from 1 to 10.", SamplingParams(temperature=0, max_tokens=3))
    assert short.finish_reason == "length" and short.usage.completion_tokens == 3


def test_ignore_eos_generates_exactly_max_tokens(llm):
    r = answer(llm, "Hi", SamplingParams(temperature=0, max_tokens=40, ignore_eos=True))
    assert r.usage.completion_tokens == 40 and r.finish_reason == "length"


def test_seeded_sampling_is_reproducible(llm):
    p = SamplingParams(temperature=1.0, seed=1234, max_tokens=16)
    assert answer(llm, "Invent a word.", p).text == answer(llm, "Invent a word.", p).text


def test_cancel_frees_the_slot(llm):
    events: queue.SimpleQueue = queue.SimpleQueue()
    params = SamplingParams(temperature=0, max_tokens=500, ignore_eos=True)
    seqs = [llm.engine.submit(llm.text_tokens(f"Story {i}:"), params, events.put) for i in range(3)]
    deadline = time.time() + 60
    while not all(s.output for s in seqs) and time.time() < deadline:
        time.sleep(0.02)
    for s in seqs:
        llm.engine.cancel(s)
    finishes = []
    while len(finishes) < 3:
        ev = events.get(timeout=30)
        if isinstance(ev, FinishEvent):
            finishes.append(ev.reason)
    assert finishes == ["cancelled"] * 3
    stats = llm.stats()
    assert stats.running == 0 and stats.free_slots == llm.engine.max_num_seqs


def test_generator_closed_early_cancels(llm):
    stream = llm.stream(llm.text_tokens("Tell a long story."),
                        SamplingParams(temperature=0, max_tokens=400, ignore_eos=True))
    assert isinstance(next(stream), TokenEvent)
    stream.close()
    deadline = time.time() + 10
    while llm.stats().running and time.time() < deadline:
        time.sleep(0.02)
    assert llm.stats().running == 0


def test_bad_requests_raise_before_streaming(llm):
    with pytest.raises(ContextOverflow, match="exceeds the context of 1024"):
        llm.engine.submit(list(range(1, 1000)), SamplingParams(max_tokens=100), lambda e: None)
    with pytest.raises(InvalidParams):
        llm.engine.submit([], GREEDY, lambda e: None)


def test_utf8_is_never_split(llm):
    r = answer(llm, "Write three emoji and the word café.",
               SamplingParams(temperature=0, max_tokens=48))
    assert "\ufffd" not in r.text


def test_queue_full(llm):
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=300, ignore_eos=True)
    sink: queue.SimpleQueue = queue.SimpleQueue()
    limit = engine.scheduler.cfg.max_queue
    seqs = []
    with pytest.raises(QueueFull):
        for _ in range(engine.max_num_seqs + limit + 1):
            seqs.append(engine.submit(llm.text_tokens("x"), params, sink.put))
    for s in seqs:
        engine.cancel(s)
    done = 0
    while done < len(seqs):
        if isinstance(sink.get(timeout=60), (FinishEvent, ErrorEvent)):
            done += 1


@pytest.mark.parametrize("setting,cache,expected", [
    (None, False, True),         # auto: on, with the prefix cache or without
    (None, True, True),
    (True, True, True),          # asked for
    (False, True, False),
])
def test_flash_attention_choice(setting, cache, expected):
    from llmctl.runtime.load_options import LoadOptions

    assert LoadOptions(flash_attn=setting, prefix_cache=cache).use_flash_attn is expected


def test_the_tile_rule_is_one_decision_and_keys_the_disk_cache(tmp_path):
    """Cuts by the tile only where exactness is asked of a build whose 64+
    row chunks take ggml's tiled kernel; a state computed under any cut
    never serves a setting held to the tile's cuts."""
    from llmctl.runtime.llama.library import has_fa_rows_kernel
    from llmctl.runtime.load_options import LoadOptions
    from llmctl.runtime.prefix_cache.cache import KvLayout, Weights, disk_identity
    from llmctl.runtime.prefix_cache.rule import tile_for

    assert tile_for(True, True, False) == 64
    assert tile_for(True, True, True) == tile_for(True, False, False) == tile_for(False, True, False) == 1
    assert has_fa_rows_kernel()             # the suite's CPUs all have AVX2, F16C and FMA
    assert LoadOptions().prompt_tile == LoadOptions(deterministic=True).prompt_tile == 1
    assert LoadOptions(kv_type="q8_0").prompt_tile == 1     # ggml's per-row kernel, any chunk
    assert LoadOptions(repack=True).prompt_tile == LoadOptions(flash_attn=False).prompt_tile == 1
    weights = Weights("m", tmp_path / "m.gguf", "ab" * 32)
    kv = {"n_ctx_seq": 1024, "n_seq_max": 2, "kv_type": "f16", "flash_attn": True, "repack": False}
    assert disk_identity(weights, KvLayout(**kv, tile=1)) != disk_identity(weights, KvLayout(**kv, tile=64))


def test_the_default_is_exact_and_deterministic_refuses_what_is_not():
    from llmctl.errors import UsageError
    from llmctl.runtime.load_options import LoadOptions

    assert not LoadOptions().repack and LoadOptions().use_flash_attn
    kept, plain = LoadOptions(deterministic=True), LoadOptions()    # a no-op kept for scripts
    assert (kept.repack, kept.use_flash_attn, kept.prompt_tile) == (
        plain.repack, plain.use_flash_attn, plain.prompt_tile)
    with pytest.raises(UsageError, match="--deterministic needs flash attention"):
        LoadOptions(deterministic=True, flash_attn=False)
    with pytest.raises(UsageError, match="--deterministic and --repack"):
        LoadOptions(deterministic=True, repack=True)
