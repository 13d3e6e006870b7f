"""The row-exactness measurement (llmctl.runtime.llama.exactness) that decides,
on the machine the suite runs on, whether greedy answers may be compared
for identity across batch shapes; `llmctl info` reporting it; and the
near-tie comparison the tests use where it says not exact (issue 20,
finding 14)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from near_tie import NEAR_TIE, assert_greedy_agree, assert_same_until_near_tie

from conftest import REPO, smollm2_file
from llmctl.runtime.llama import ContextConfig, LlamaContext, LlamaModel
from llmctl.runtime.llama import exactness as ex


@pytest.mark.parametrize("flash_attn", [False, True])
def test_the_measurement_is_consistent_and_cached(exactness, flash_attn):
    r = exactness(flash_attn=flash_attn)
    assert r.flash_attn is flash_attn and r.model == smollm2_file().name and not r.repack
    assert r.exact == (r.max_logit_diff == 0.0) == (max(r.rows_diff, r.seqs_diff) == 0.0)
    assert r.exact == (r.top_logprob_diff == 0.0)
    assert ex.measure_rows(smollm2_file(), flash_attn=flash_attn) is r     # once a process
    assert ("not exact" in r.summary()) is not r.exact


@pytest.mark.parametrize("flash_attn", [False, True])
def test_rounding_stays_well_inside_the_near_tie_bound(exactness, flash_attn):
    # Two candidates' gap moves by at most twice this; NEAR_TIE must cover
    # that with room to spare, or the comparison would flag rounding as a bug.
    assert exactness(flash_attn=flash_attn).top_logprob_diff < NEAR_TIE / 2


def test_flash_attention_stays_exact_past_the_split_kv_length():
    # ggml gives a lone decode row over 512+ KV cells a split-KV kernel that
    # rounds otherwise than the per-row one; llmctl's build turns it off
    # (scripts/llama_cpp_slim.cmake). A library built without that fails here.
    r = ex.measure_rows(smollm2_file(), flash_attn=True, context=600)
    assert r.exact, r


def test_the_same_shape_gives_the_same_logits_on_every_cpu():
    # What the near-tie comparison relies on everywhere: rounding depends on
    # the batch shape, never on chance. A fresh measurement repeats the figures.
    path = smollm2_file().resolve()
    first = ex._measure(path, False, True, 2, ex.CONTEXT)
    again = ex._measure(path, False, True, 2, ex.CONTEXT)
    assert (again.rows_diff, again.seqs_diff) == (first.rows_diff, first.seqs_diff)


def test_exact_rows_mean_a_split_prompt_ends_as_a_whole_one(exactness):
    # Where the measurement says exact, a prompt decoded in one batch and the
    # same prompt with its last token decoded alone (a prefix-cache hit's
    # shape) give bit-identical logits; where not, they differ only slightly.
    model = LlamaModel(smollm2_file())
    try:
        ctx = LlamaContext(model, ContextConfig(n_ctx_seq=256, n_seq_max=2, n_batch=256,
                                                n_threads=2, flash_attn=False))
        tokens = model.tokenize(ex.TEXT, add_special=False)[:80]
        whole = ctx.logits(ctx.decode([(0, tokens, 0, 1)])[0]).copy()
        ctx.decode([(1, tokens[:-1], 0, 0)])
        split = ctx.logits(ctx.decode([(1, tokens[-1:], len(tokens) - 1, 1)])[0]).copy()
    finally:
        model.close()
    diff = float(np.abs(whole - split).max())
    if exactness(flash_attn=False).exact:
        assert diff == 0.0
    else:
        assert diff < 4 * exactness(flash_attn=False).max_logit_diff + 0.5


def test_info_reports_the_measured_guarantee(exactness):
    env = {**os.environ, "LLMCTL_MODEL": "smollm2"}
    shown = subprocess.run([sys.executable, "-m", "llmctl", "info", "--json"], env=env,
                           capture_output=True, text=True, timeout=300)
    assert shown.returncode == 0, shown.stderr
    got = json.loads(shown.stdout)["exactness"]
    assert got["measured"] and got["model"] == "smollm2"
    default, repacked = got["default"], got["repack"]
    assert default["flash_attn"] and not default["repack"] and default["cache_hits_exact"]
    assert repacked["flash_attn"] and repacked["repack"]
    assert default["exact"] is True, default    # what the default promises
    # SmolLM2's Q4_1 is never repacked: --repack changes nothing there.
    assert repacked["max_logit_diff"] == default["max_logit_diff"]
    text = subprocess.run([sys.executable, "-m", "llmctl", "info"], env=env,
                          capture_output=True, text=True, timeout=300).stdout
    assert "exactness" in text and "docs/exactness.md" in text
    skipped = subprocess.run([sys.executable, "-m", "llmctl", "info", "--json", "--no-exactness"],
                             env=env, capture_output=True, text=True, timeout=300)
    assert "exactness" not in json.loads(skipped.stdout)


@pytest.mark.slow
def test_bench_rows_reports_the_modules_figures(exactness):
    r = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_rows.py"), "--model",
                        "smollm2", "--repeat", "1", "--context", str(ex.CONTEXT),
                        "--flash-attn", "off", "--json"],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    repacked = json.loads(r.stdout)["repacked"]
    assert repacked["max_logit_diff"] == exactness(flash_attn=False).rows_diff
    assert repacked["beside_other_seqs_diff"] == exactness(flash_attn=False).seqs_diff


# ---- the comparison itself, on made-up answers ------------------------------------------------

TOP = [[(5, -0.1), (6, -3.0)], [(7, -0.70), (8, -0.72)], [(9, -0.2), (3, -4.0)]]


def test_answers_may_part_only_at_a_near_tie():
    assert assert_same_until_near_tie([5, 7, 9], [5, 7, 9], TOP) is None
    assert assert_same_until_near_tie([5, 7, 9], [5, 8, 1], TOP) == 1     # 0.02 nats apart
    with pytest.raises(AssertionError, match="not at a near-tie"):
        assert_same_until_near_tie([5, 7, 9], [6, 7, 9], TOP)             # 2.9 nats apart
    with pytest.raises(AssertionError, match="not at a near-tie"):
        assert_same_until_near_tie([5, 7, 9], [5, 7, 3], TOP)             # after the tie, sure
    with pytest.raises(AssertionError, match="not at a near-tie"):
        assert_same_until_near_tie([5, 7, 9], [5, 4, 9], TOP)             # not a candidate


def test_texts_part_only_at_a_near_tie():
    ref, top = ["1.", " Red", ":", " This"], [[("1.", -0.1)] * 2, [(" Red", -0.3), (" Blue", -2)],
                                             [(":", -1.0), ("\n", -1.6)],
                                             [(" This", -1.969), (" The", -1.988)]]
    assert assert_same_until_near_tie(ref, "1. Red: This", top) is None
    assert assert_same_until_near_tie(ref, "1. Red: The most", top) == 3
    assert assert_same_until_near_tie(ref, "1. Red\n2.", top) == 2           # 0.6 nats
    with pytest.raises(AssertionError, match="not at a near-tie"):
        assert_same_until_near_tie(ref, "1. Blue: The", top)


def test_exact_machines_compare_for_identity():
    class Exact:
        exact = True

    assert assert_greedy_agree(Exact, [5, 7, 9], [5, 7, 9]) is None
    with pytest.raises(AssertionError, match="identical"):
        assert_greedy_agree(Exact, [5, 7, 9], [5, 8, 1], TOP)          # a tie is no excuse here


def test_a_batch_refuses_rows_past_its_end_and_the_context_still_works():
    # Past n_batch the batch's arrays end: a row there would be written over
    # other memory, so it is refused before anything is written.
    model = LlamaModel(smollm2_file())
    try:
        ctx = LlamaContext(model, ContextConfig(n_ctx_seq=256, n_seq_max=2, n_batch=64,
                                                n_threads=2))
        tokens = model.tokenize(ex.TEXT, add_special=False)
        with pytest.raises(ValueError, match="65 tokens do not fit a batch of 64"):
            ctx.decode([(0, tokens[:40], 0, 1), (1, tokens[:25], 0, 1)])
        with pytest.raises(ValueError, match="do not fit"):
            ctx.decode_rows(tokens[:65], 60)
        whole = ctx.decode_rows(tokens[:64], 63)[0].copy()
        assert whole.shape == (model.n_vocab,) and np.isfinite(whole).all()
        ctx.close()
    finally:
        model.close()
