"""Flash attention with exact prefix hits: the scheduler's cuts without a
model (the tile rule, for a build without llmctl's per-row kernel), then the
real model with flash attention on, where every hit (memory, disk, a
conversation's next turn) and a prompt computed beside a decoding neighbour
must give the same log-probabilities, to the bit, as a cold prefill run
alone."""

from __future__ import annotations

import pytest
from near_tie import assert_same_until_near_tie, top_from_engine
from test_prefix_cache import SHARED, SUFFIXES, kv_files, load

from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.engine.sequence import Sequence, Status
from llmctl.runtime.prefix_cache.rule import exact_reuse
from llmctl.runtime.sampling import SamplingParams

TILE = SchedulerConfig.tile
# Log-probabilities expose any change in the logits, not only in the argmax.
EXACT = SamplingParams(temperature=0, max_tokens=6, logprobs=3)


def seq(n: int, start: int = 0) -> Sequence:
    return Sequence(prompt=list(range(start, start + n)), params=SamplingParams(), max_new=4)


def admitted(s: Scheduler, *seqs: Sequence) -> None:
    for x in seqs:
        s.add(x)
    s.admit()


# ---- the cuts, no model ---------------------------------------------------------


def test_a_hit_leaves_a_tile_to_compute_and_short_prompts_reuse_nothing():
    assert exact_reuse(300, 310, TILE) == 310 - TILE
    assert exact_reuse(100, 400, TILE) == 100
    assert exact_reuse(40, 50, TILE) == 0
    assert exact_reuse(309, 310, 1) == 309


def test_a_chunk_cut_for_the_budget_leaves_a_tile_on_both_sides():
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=200))
    a = seq(230)
    admitted(s, a)
    (w,) = s.schedule()
    assert len(w.tokens) == 230 - TILE      # 200 would leave a 30-row chunk
    a.n_computed += len(w.tokens)
    (w,) = s.schedule()
    assert len(w.tokens) == TILE and w.sample


def test_chunks_are_capped_at_one_ubatch():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2048))
    admitted(s, seq(1000))
    (w,) = s.schedule()
    assert len(w.tokens) == 512


def test_a_long_prompts_chunk_runs_alone_and_its_neighbours_still_decode():
    s = Scheduler(SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=512))
    a, b, c, d = seq(10), seq(200, 1000), seq(10, 2000), seq(100, 3000)
    admitted(s, a, b, c, d)
    assert [x.slot for x in (a, b, c, d)] == [0, 1, 2, 3]
    for x in (a, c):
        x.status = Status.DECODING
        x.output.append(5)
    plan = s.schedule()
    # Everyone runs: b and d (prompts of a tile or more) each get a
    # llama_decode call of their own, beside a and c's decode rows.
    assert {w.seq.slot: w.alone for w in plan} == {0: False, 1: True, 2: False, 3: True}
    assert [len(w.tokens) for w in plan if w.alone] == [200, 100]


def test_prompts_shorter_than_a_tile_share_the_call():
    s = Scheduler(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=512))
    a, b = seq(TILE - 1), seq(TILE, 1000)
    admitted(s, a, b)
    assert [(len(w.tokens), w.alone) for w in s.schedule()] == [(TILE - 1, False), (TILE, True)]
    plain = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=512, tile=1))
    admitted(plain, seq(300))
    assert [w.alone for w in plain.schedule()] == [False]


def test_only_prompt_tokens_are_parked():
    s = Scheduler(SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=512,
                                  prefix_sharing=True))
    a = seq(100)
    admitted(s, a)
    a.n_computed += 100
    for t in (7, 8, 9):
        Scheduler.on_token(a, t)
    a.n_computed += 2
    s.finish(a, "stop", park=a.tokens[:a.n_computed])
    assert s.parked_slots() == {a.slot: a.prompt}


# ---- the real model, flash attention on -----------------------------------------


def ask(llm, prompt: list[int]):
    c = llm.complete(prompt, EXACT)
    return c.text, c.logprobs, c.usage.cached_tokens


def load_fa(home, **opts):
    # Serve's default, flash attention on, held to exactness.
    return load(home, flash_attn=True, deterministic=True, **opts)


def same(exactness, got, ref) -> None:
    """(text, logprobs) of a hit against a cold run's: to the bit where this
    machine's rows measure exact under flash attention (the tile cuts then
    make every hit exact), else the same tokens up to the first near-tie."""
    if exactness(flash_attn=True).exact:
        assert got == ref
        return
    assert_same_until_near_tie([lp.chosen.token for lp in ref[1]],
                               [lp.chosen.token for lp in got[1]], top_from_engine(ref[1]))


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    with load_fa(tmp_path_factory.mktemp("tok"), prefix_cache=False) as llm:
        return {s: llm.text_tokens(SHARED + s) for s in SUFFIXES}


@pytest.fixture(scope="module")
def cold(tmp_path_factory, prompts):
    """Outputs and log-probabilities of cold prefills, flash attention on."""
    with load_fa(tmp_path_factory.mktemp("cold"), prefix_cache=False) as llm:
        assert llm.engine.flash_attn
        return {s: ask(llm, p)[:2] for s, p in prompts.items()}


def test_memory_hits_are_bit_exact(tmp_path, prompts, cold, exactness):
    with load_fa(tmp_path, prefix_cache_size_gb=0) as llm:
        for s in SUFFIXES:
            text, logprobs, cached = ask(llm, prompts[s])
            same(exactness, (text, logprobs), cold[s])
        assert cached > 0       # the later ones hit the first one's prefix


def test_disk_hits_are_bit_exact(tmp_path, prompts, cold, exactness):
    with load_fa(tmp_path) as llm:
        same(exactness, ask(llm, prompts[SUFFIXES[0]])[:2], cold[SUFFIXES[0]])
        llm.prefix_cache.disk.flush()
    assert kv_files(tmp_path)
    with load_fa(tmp_path) as llm:
        text, logprobs, cached = ask(llm, prompts[SUFFIXES[1]])
        same(exactness, (text, logprobs), cold[SUFFIXES[1]])
        assert cached >= 256 and llm.stats().cached_tokens_disk == cached


def test_next_turn_of_a_conversation_is_bit_exact(tmp_path, prompts, exactness):
    with load_fa(tmp_path, prefix_cache_size_gb=0) as llm:
        c = llm.complete(prompts[SUFFIXES[0]], EXACT)
        # The reply's own KV came from one-row decode steps: only the prompt is reused.
        turn = llm.text_tokens(SHARED + SUFFIXES[0] + c.text + " And then?")
        warm = ask(llm, turn)
    with load_fa(tmp_path / "cold", prefix_cache=False) as llm:
        same(exactness, warm[:2], ask(llm, turn)[:2])
    assert warm[2] > 0


def test_a_prompt_beside_a_decoding_neighbour_computes_as_alone(tmp_path, prompts, exactness):
    """b's prompt is computed while a, in the next slot, decodes: its chunks
    share llama_decode calls with a's rows (any cut and any company: the
    per-row kernel takes every chunk), and its first token's
    log-probabilities are those of b alone."""
    a_prompt, b_prompt = prompts[SUFFIXES[0]], prompts[SUFFIXES[1]]
    with load_fa(tmp_path, prefix_cache=False) as llm:
        alone = llm.complete(b_prompt, EXACT).logprobs[:1]
        calls: list[list[tuple[int, int]]] = []
        decode = llm.engine.ctx.decode

        def spy(items):
            calls.append([(seq_id, len(tokens)) for seq_id, tokens, _, _ in items])
            return decode(items)

        llm.engine.ctx.decode = spy
        a = llm.stream(a_prompt, SamplingParams(temperature=0, max_tokens=48, ignore_eos=True))
        next(a)                                 # a decodes from now on
        beside = llm.complete(b_prompt, EXACT).logprobs[:1]
        list(a)
    a_slot = calls[0][0][0]                     # a's first prompt chunk
    b_chunks = [(i, n) for i, call in enumerate(calls) for slot, n in call
                if slot != a_slot and n > 1]
    assert sum(n for _, n in b_chunks) == len(b_prompt)
    assert any((a_slot, 1) in calls[i] for i, _ in b_chunks)    # a's rows in its calls
    same(exactness, ("", beside), ("", alone))
