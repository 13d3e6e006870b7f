"""Embeddings: llmctl.runtime.embed on the real SmolLM2 (shape, unit norm,
batching, dimensions, truncation, errors, and meaning: similar sentences
score closer than unrelated ones), and /v1/embeddings on a real `llmctl
serve` through the official openai client and raw HTTP."""

from __future__ import annotations

import base64
import threading

import httpx
import numpy as np
import openai
import pytest

from conftest import smollm2_file
from llmctl.bench.launcher import Server
from llmctl.errors import ContextOverflow, InvalidParams, LlmctlError
from llmctl.runtime.embed import MAX_INPUTS, MAX_SEQS, embed_texts, embed_tokens, embedder, pooling_for

# (anchor, paraphrase, unrelated): the paraphrase must be the closer one.
TRIPLES = [
    ("The cat sat on the mat.", "A cat is sitting on a rug.",
     "Quarterly revenue rose by 4 percent."),
    ("How do I bake bread at home?", "What is a simple recipe for homemade bread?",
     "The stock market fell sharply today."),
    ("The weather is sunny and warm today.", "It is a bright, hot day outside.",
     "Python is a programming language."),
    ("He plays the guitar in a rock band.", "She is a drummer in a music group.",
     "The patient was given antibiotics."),
]
SENTENCES = [s for triple in TRIPLES for s in triple]


def _vectors(llm, texts, **kwargs) -> np.ndarray:
    return np.array(embed_texts(llm, texts, **kwargs)[0])


# ---- runtime ------------------------------------------------------------------------


def test_shape_norm_and_token_count(llm):
    texts = ["The cat sat on the mat.", "Hello"]
    vectors, n = embed_texts(llm, texts)
    assert len(vectors) == 2 and all(len(v) == llm.model.n_embd for v in vectors)
    assert np.linalg.norm(np.array(vectors), axis=1) == pytest.approx([1.0, 1.0], abs=1e-5)
    assert n == sum(len(llm.model.tokenize(t, parse_special=False)) for t in texts)
    assert pooling_for(llm.model) == "mean"     # SmolLM2 declares no pooling


def test_deterministic(llm):
    assert np.array_equal(_vectors(llm, SENTENCES[:3]), _vectors(llm, SENTENCES[:3]))


def test_a_small_batch_equals_one_at_a_time(llm):
    # Equal up to rounding: the embedding context's one shared KV puts a
    # text at another cell offset in a batch than alone, and flash
    # attention's softmax sum takes a block's cells in vector lanes by their
    # offset (scripts/llama_cpp_fa_rows.h), so the last bits move (measured
    # 8e-4 on these unit vectors). The engine's KV, a stream per sequence,
    # starts every sequence at cell 0.
    together = _vectors(llm, SENTENCES[:3])
    alone = np.vstack([_vectors(llm, [t]) for t in SENTENCES[:3]])
    assert np.einsum("ij,ij->i", together, alone).min() > 0.99999
    assert np.abs(together - alone).max() < 3e-3


def test_a_large_batch_matches_one_at_a_time(llm):
    # More texts than one decode takes, so this spans two batches. Past
    # about 64 tokens a batch, llama.cpp's CPU kernels change how they sum,
    # so vectors agree to a cosine of 1 - 3e-4 there, not to the last bits.
    texts = [f"{SENTENCES[i % len(SENTENCES)]} ({i})" for i in range(MAX_SEQS + 2)]
    together = _vectors(llm, texts)
    alone = np.vstack([_vectors(llm, [t]) for t in texts])
    assert np.einsum("ij,ij->i", together, alone).min() > 0.999
    assert np.abs(together - alone).max() < 2e-2


def test_similar_sentences_score_closer_than_unrelated(llm):
    e = _vectors(llm, SENTENCES)
    for k, (a, b, c) in enumerate(TRIPLES):
        va, vb, vc = e[3 * k: 3 * k + 3]
        assert va @ vb > va @ vc, (a, b, c)
        assert va @ vb > vb @ vc, (a, b, c)


def test_concurrent_callers_get_the_same_vectors(llm):
    expected = _vectors(llm, SENTENCES[:4])
    results: list = [None] * 4

    def work(i):
        results[i] = _vectors(llm, SENTENCES[:4])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(np.abs(r - expected).max() < 1e-4 for r in results)


def test_dimensions_keep_the_first_components_renormalised(llm):
    full = _vectors(llm, SENTENCES[:2])
    short = _vectors(llm, SENTENCES[:2], dimensions=64)
    assert short.shape == (2, 64)
    prefix = full[:, :64] / np.linalg.norm(full[:, :64], axis=1, keepdims=True)
    assert np.abs(short - prefix).max() < 1e-5
    assert _vectors(llm, SENTENCES[:1], dimensions=llm.model.n_embd).shape == (1, llm.model.n_embd)


@pytest.fixture(scope="module")
def short_llm(session_home):
    """SmolLM2 whose embeddings take 256 tokens a decode: long inputs stay
    quick to embed on a CPU."""
    from llmctl.runtime import embed
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.store.resolve import ResolvedModel

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(embed, "MIN_TOKENS", 256)
        mp.setattr(embed, "MAX_TOKENS", 256)
        llm = LLM(ResolvedModel("smollm2", smollm2_file(), context=256),
                  LoadOptions(max_num_seqs=1, max_num_batched_tokens=64, prefix_cache=False))
        embed.embedder(llm)
    with llm:
        yield llm


def test_long_input_is_truncated_or_refused(short_llm):
    llm = short_llm
    limit = embedder(llm).n_tokens
    assert limit == 256
    text = "The quick brown fox jumps over the lazy dog. " * 100
    vectors, n = embed_texts(llm, [text, "short"])
    assert n == limit + len(llm.model.tokenize("short", parse_special=False))
    head = llm.model.tokenize(text, parse_special=False)[:limit]
    assert np.abs(np.array(vectors[0]) - np.array(embed_tokens(llm, [head])[0][0])).max() < 1e-4
    with pytest.raises(ContextOverflow) as e:
        embed_texts(llm, [text], truncate=False)
    assert e.value.param == "input"
    assert embed_texts(llm, ["short"], truncate=False)[1] > 0


def test_token_input_equals_text_input(llm):
    tokens = [llm.model.tokenize(s, parse_special=False) for s in SENTENCES[:3]]
    by_tokens, n = embed_tokens(llm, tokens)
    assert n == sum(map(len, tokens))
    assert np.abs(np.array(by_tokens) - _vectors(llm, SENTENCES[:3])).max() < 1e-6


@pytest.mark.parametrize("texts, kwargs, param", [
    ([], {}, "input"),
    ("a string, not a list", {}, "input"),
    (["fine", 3], {}, "input"),
    (["fine", ""], {}, "input"),
    (["x"] * (MAX_INPUTS + 1), {}, "input"),
    (["fine"], {"dimensions": 0}, "dimensions"),
    (["fine"], {"dimensions": 10**6}, "dimensions"),
    (["fine"], {"dimensions": True}, "dimensions"),
])
def test_bad_requests_name_the_field(llm, texts, kwargs, param):
    with pytest.raises(InvalidParams) as e:
        embed_texts(llm, texts, **kwargs)
    assert e.value.param == param


@pytest.mark.parametrize("seqs", [[[]], [[1, -1]], [[1, 10**9]], [[1, True]]])
def test_bad_token_ids_are_refused(llm, seqs):
    with pytest.raises(InvalidParams, match="input"):
        embed_tokens(llm, seqs)


def test_unloading_the_model_frees_its_embeddings_context(session_home):
    from llmctl.runtime.llm import LLM, LoadOptions
    from llmctl.store.resolve import ResolvedModel

    llm = LLM(ResolvedModel("smollm2", smollm2_file(), context=256),
              LoadOptions(max_num_seqs=1, max_num_batched_tokens=64, prefix_cache=False))
    assert len(embed_texts(llm, ["before"])[0]) == 1
    llm.close()     # frees the embeddings context before the weights
    with pytest.raises(LlmctlError, match="unloaded"):
        embed_texts(llm, ["after"])


# ---- server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "512", "--max-num-seqs", "2",
                             "--no-prefix-cache", env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_floats(client, llm):
    r = client.embeddings.create(model="smollm2", input=SENTENCES[:3], encoding_format="float")
    assert r.object == "list" and r.model == "smollm2"
    assert [d.index for d in r.data] == [0, 1, 2]
    got = np.array([d.embedding for d in r.data])
    assert np.linalg.norm(got, axis=1) == pytest.approx([1.0] * 3, abs=1e-5)
    # The server's vectors are the library's (its thread count may differ).
    assert np.abs(got - _vectors(llm, SENTENCES[:3])).max() < 1e-3
    assert r.usage.prompt_tokens == r.usage.total_tokens == embed_texts(llm, SENTENCES[:3])[1]


def test_openai_client_base64(client, served):
    floats = client.embeddings.create(model="smollm2", input="The cat sat on the mat.",
                                      encoding_format="float").data[0].embedding
    # With no encoding_format the client asks for base64 and decodes it.
    decoded = client.embeddings.create(model="smollm2", input="The cat sat on the mat.")
    assert np.array(decoded.data[0].embedding) == pytest.approx(floats, abs=1e-7)
    raw = httpx.post(served.url + "/v1/embeddings", timeout=60,
                     json={"input": "The cat sat on the mat.", "encoding_format": "base64"})
    assert raw.status_code == 200, raw.text
    packed = raw.json()["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(packed), dtype="<f4") == pytest.approx(floats, abs=1e-7)


def test_openai_client_dimensions_and_tokens(client, llm):
    r = client.embeddings.create(model="smollm2", input=["a", "b"], dimensions=32,
                                 encoding_format="float")
    assert [len(d.embedding) for d in r.data] == [32, 32]
    tokens = llm.model.tokenize(SENTENCES[0], parse_special=False)
    one = client.embeddings.create(model="smollm2", input=tokens, encoding_format="float")
    many = client.embeddings.create(model="smollm2", input=[tokens, tokens],
                                    encoding_format="float")
    assert len(many.data) == 2 and one.usage.prompt_tokens == len(tokens)
    assert np.array(many.data[1].embedding) == pytest.approx(one.data[0].embedding, abs=1e-5)


@pytest.mark.parametrize("body, param", [
    ({"input": []}, "input"),
    ({"input": [""]}, "input"),
    ({"input": [1.5]}, "input"),
    ({"input": ["a", 1]}, "input"),
    ({}, "input"),
    ({"input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "a", "dimensions": 0}, "dimensions"),
    ({"input": "a", "dimensions": "8"}, "dimensions"),
    ({"input": "a", "normalize": False}, "normalize"),
    ({"input": "a", "input_type": "query"}, "input_type"),
    ({"input": "a", "truncate": "no"}, "truncate"),
    ({"input": "a", "model": "no-such-model"}, "model"),
    ({"input": "word " * 5000, "truncate": False}, "input"),
])
def test_bad_requests_are_400s_naming_the_field(served, body, param):
    r = httpx.post(served.url + "/v1/embeddings", json=body, timeout=60)
    assert r.status_code in (400, 404), r.text
    assert r.json()["error"]["param"] == param


def test_fields_that_ask_for_the_default_are_accepted(served):
    r = httpx.post(served.url + "/v1/embeddings", timeout=60,
                   json={"input": "a", "normalize": True, "user": "u1", "keep_alive": "5m",
                         "unknown_but_null": None})
    assert r.status_code == 200, r.text
