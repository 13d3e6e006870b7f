"""Draft-model speculation (`--draft`): the tokenizer check, the drafter's
KV bookkeeping, and exactness through the real engine. The draft is SmolLM2
itself re-quantized to Q3_K_S: the same tokenizer with different logits, so
its guesses are sometimes wrong and the rejection path runs, as with a real
small draft (the benchmark pairs Qwen2.5-Coder 0.5B and 1.5B)."""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from near_tie import assert_completions_agree

from llmctl.errors import UsageError
from llmctl.runtime.engine.scheduler import Scheduler, SchedulerConfig
from llmctl.runtime.llama import ContextConfig, LlamaModel, capture_log, file_types, quantize_file
from llmctl.runtime.llama.exactness import measure_rows
from llmctl.runtime.llm import LLM, LoadOptions, check_draft
from llmctl.runtime.sampling import SamplingParams
from llmctl.runtime.speculation.draft import Drafter, check_compatible
from llmctl.runtime.speculation.spec_config import SpecConfig
from llmctl.store.resolve import ResolvedModel, resolve_model
from tests.conftest import smollm2_file
from tests.test_speculate import PARAMS, answers, decoding, same_as_plain


@pytest.fixture(scope="module")
def draft_file(tmp_path_factory) -> Path:
    dst = tmp_path_factory.mktemp("draft") / "smollm2-q3_k_s.gguf"
    with capture_log() as cap:
        rc = quantize_file(smollm2_file(), dst, file_types()["Q3_K_S"], allow_requantize=True)
    assert rc == 0, cap.last_error("quantize failed")
    return dst


def load(**kw) -> LLM:
    # Flash attention on, as in test_speculate.py: a checked row then gets
    # the logits of a lone decode row, so answers can be compared exactly.
    return LLM(ResolvedModel("smollm2", smollm2_file(), context=1024),
               LoadOptions(max_num_seqs=4, threads=2, flash_attn=True, **kw))


# ---- the pair --------------------------------------------------------------------------

def test_a_draft_with_another_tokenizer_is_refused():
    gemma = resolve_model("gemma3-270m")
    smol = LlamaModel(smollm2_file(), vocab_only=True)
    other = LlamaModel(gemma.path, vocab_only=True)
    try:
        with pytest.raises(UsageError, match="does not share 'smollm2''s tokenizer"):
            check_compatible(smol, other, ("smollm2", "gemma3-270m"))
        check_compatible(smol, smol, ("smollm2", "smollm2"))
    finally:
        other.close()
        smol.close()
    with pytest.raises(UsageError, match="tokenizer"):
        check_draft(ResolvedModel("smollm2", smollm2_file()), LoadOptions(draft="gemma3-270m"))


def test_draft_mode_needs_a_draft_and_excludes_ngram():
    with pytest.raises(UsageError, match="no draft model for 'smollm2'"):
        check_draft(ResolvedModel("smollm2", smollm2_file()), LoadOptions(spec="draft"))
    with pytest.raises(UsageError, match="--spec ngram does not use"):
        LoadOptions(spec="ngram", draft="smollm2")
    assert LoadOptions(draft="x").spec_config.mode == "draft"


def test_the_cli_refuses_a_mismatched_pair_in_one_line(tmp_path):
    out = subprocess.run([sys.executable, "-m", "llmctl", "run", "smollm2", "hi",
                          "--draft", "gemma3-270m", "--max-tokens", "4"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not share" in lines[0] and "Traceback" not in out.stderr


# ---- the scheduler and the drafter ---------------------------------------------------------

def test_draft_mode_gives_room_and_leaves_the_guesses_to_the_engine():
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("draft", 8, 2), tile=1))
    decoding(s, 2)
    plan = s.schedule()
    assert [(w.room, w.draft, len(w.tokens)) for w in plan] == [(4, [], 1)] * 2
    s = Scheduler(SchedulerConfig(32, 512, spec=SpecConfig("draft", 8, 2), tile=1))
    decoding(s, 5)      # 8 rows over 5 sequences: 1 each, under draft_min
    assert {w.room for w in s.schedule()} == {0}


def tokens(guesses):
    return [g.tokens for g in guesses]


def test_the_drafter_feeds_only_what_its_kv_lacks(draft_file):
    model = LlamaModel(draft_file)
    cfg = ContextConfig(n_ctx_seq=512, n_seq_max=2, n_batch=64, n_threads=2)
    used, fresh = Drafter(model, cfg, p_min=0.0), Drafter(model, cfg, p_min=0.0)
    try:
        prompt = model.tokenize("The capital of France is Paris. The capital of Spain is")
        first = used.propose([(0, prompt, 4)])[0].tokens
        assert len(first) == 4
        # The sequence went on another way than guessed: the stale guesses
        # must leave the KV, or the next guesses would read them.
        went = prompt + [first[0], (first[1] + 1) % model.n_vocab]
        # The same guesses where this machine's rows are exact (a fed tail is
        # computed in another batch shape than a fresh prefill), else as many.
        same = _same_guesses(measure_rows(draft_file, flash_attn=True).exact)
        same(tokens(used.propose([(0, went, 3)])), tokens(fresh.propose([(1, went, 3)])))
        # A longer prompt than one batch is fed in chunks.
        long = (prompt * 12)[:150]
        same(tokens(used.propose([(0, long, 2)])), tokens(fresh.propose([(1, long, 2)])))
    finally:
        used.close()
        fresh.close()
        model.close()


def _same_guesses(exact: bool):
    def check(a: list, b: list) -> None:
        assert a == b if exact else [len(x) for x in a] == [len(x) for x in b]
    return check


# ---- exactness through the engine ------------------------------------------------------------

@pytest.fixture(scope="module")
def plain():
    with load(prefix_cache=False) as llm:
        return answers(llm, PARAMS)


@pytest.mark.slow
def test_draft_speculation_gives_exactly_plain_decoding(plain, draft_file, exactness):
    # Greedy with logprobs, and two seeded samplings at temperature 0.9 and
    # 0.7 (one with stop strings): the target samples every checked row with
    # the request's own sampler, so a seed gives the same text as without.
    with load(prefix_cache=False, draft=str(draft_file), draft_p_min=0.0) as llm:
        same_as_plain(exactness, answers(llm, PARAMS), plain)
        stats = llm.stats()
    assert stats.spec_steps > 0 and 0 < stats.spec_accepted < stats.spec_drafted


@pytest.mark.slow
def test_seeded_samples_match_plain_decoding_seed_for_seed(draft_file, exactness):
    # Sampling at temperature 1 from many seeds: the output distribution is
    # unchanged because every seed's output is (a stronger check than
    # comparing histograms, which a wrong rule could pass by chance).
    prompt = [{"role": "user", "content": "Pick a random fruit and describe it in one line."}]
    params = [SamplingParams(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=s,
                             max_tokens=10) for s in range(16)]
    outs = []
    for kw in ({}, {"draft": str(draft_file), "draft_p_min": 0.0}):
        with load(prefix_cache=False, **kw) as llm:
            tokens = llm.chat_tokens(prompt)
            outs.append([llm.complete(tokens, p).text for p in params])
            stats = llm.stats()
    if exactness(flash_attn=True).exact:      # else a draw may flip at any near-tie
        assert outs[0] == outs[1]
    assert len(outs[1]) == len(outs[0]) and all(outs[1])
    assert len(set(outs[0])) > 8          # the seeds did sample different texts
    assert 0 < stats.spec_accepted < stats.spec_drafted


SYSTEM = ("You are a careful assistant for a hardware shop. " * 3 + "Policies: returns within 30 days "
          "with a receipt; repairs take five working days; we sell tools, paint, timber and "
          "garden supplies; opening hours are eight to six on weekdays and nine to four on "
          "Saturdays; delivery is free over fifty pounds. Answer in one short sentence. ") * 2


@pytest.mark.slow
def test_draft_speculation_with_the_prefix_cache_and_concurrency(tmp_path, monkeypatch, draft_file,
                                                                exactness):
    # Four requests at once share a long system prompt: one computes it, the
    # others reuse its KV, while the drafter catches each slot up on its own.
    monkeypatch.setenv("LLMCTL_HOME", str(tmp_path))
    questions = ["When are you open on Saturday?", "Can I return a drill?",
                 "Do you sell paint?", "How long do repairs take?"]
    with load(draft=str(draft_file)) as llm:
        jobs = [llm.chat_tokens([{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": q}]) for q in questions]
        params = SamplingParams(temperature=0, max_tokens=40, logprobs=5)
        with ThreadPoolExecutor(4) as pool:
            got = list(pool.map(lambda t: llm.complete(t, params), jobs))
        again = llm.complete(jobs[0], params)      # its own prefix, from a parked slot
        stats = llm.stats()
    assert all(c.text and c.finish_reason in ("stop", "length") for c in got)
    assert_completions_agree(exactness(flash_attn=True), got[0], again)
    assert stats.spec_accepted > 0 and stats.cached_tokens > 0
    assert stats.requests["ok"] == 5


@pytest.mark.slow
def test_serve_and_run_with_a_draft(session_home, draft_file, exactness):
    # Through the CLI as a user runs it: `run` gives plain decoding's answer,
    # and the server answers n=2 and a stream with the draft on, counting it.
    import openai

    from llmctl.bench.launcher import Server

    env = {"LLMCTL_HOME": str(session_home)}
    # `run` keeps no prefix cache, so flash attention is on: exact, as above.
    ask = ["run", "smollm2", "List three fruits.", "--temperature", "0", "--max-tokens", "24"]
    runs = [subprocess.run([sys.executable, "-m", "llmctl", *ask, *extra], capture_output=True,
                           text=True, timeout=300, env={**os.environ, **env})
            for extra in ([], ["--draft", str(draft_file)])]
    assert runs[0].returncode == 0 and runs[0].stdout.strip()
    assert runs[1].returncode == 0 and runs[1].stdout.strip()
    if exactness(flash_attn=True).exact:       # `run` prints no logprobs to compare a tie by
        assert runs[1].stdout == runs[0].stdout
    with Server.llmctl_serve("smollm2", "--ctx-size", "1024", "--max-num-seqs", "4",
                             "--draft", str(draft_file), env=env) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)
        msgs = [{"role": "user", "content": "Count from one to ten in words."}]
        two = client.chat.completions.create(model="smollm2", messages=msgs, n=2, max_tokens=32,
                                             temperature=0.8, seed=5)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="smollm2", messages=msgs, max_tokens=32, temperature=0, stream=True))
        stats = httpx.get(srv.url + "/stats", timeout=30).json()
    assert len(two.choices) == 2 and all(c.message.content for c in two.choices)
    assert streamed and stats["spec_steps"] > 0 and stats["spec_accepted_tokens"] > 0
