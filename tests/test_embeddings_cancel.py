"""Embeddings stop when the client leaves, take turns a batch at a time, and
have a per-request token cap (#20, finding 5: 64 inputs of ~1,280 tokens
computed for 25 minutes after the client left, and small requests queued
behind them).

What was computed is read from the stats counters (embedding_tokens,
embedding_requests), never from timing: a request that stopped has
computed fewer tokens than it asked for. Runs on the real SmolLM2 and a
real `llmctl serve`. A batch of SmolLM2 embeddings costs about 0.3 GFLOP a
token, so the requests here are made of many small batches in-process and
of half-width ones (one input a batch) over HTTP, marked slow."""

from __future__ import annotations

import json
import socket
import threading

import httpx
import numpy as np
import pytest

from conftest import wait_until
from llmctl.bench.launcher import Server
from llmctl.errors import InvalidParams
from llmctl.runtime.embed import (
    CancelFlag,
    Cancelled,
    embed_tokens,
    embedder,
)
from llmctl.settings import Settings

WAIT_S = 300
CAP = 200_000                   # the test server's LLMCTL_EMBED_MAX_TOKENS
LONG_TEXT = "hello " * 1400     # 1,401 SmolLM2 tokens: cut to one full batch (1,280)
HALF_TEXT = "hello " * 640      # 641 tokens: two never share a batch of 1,280
BIG = [HALF_TEXT] * 150         # 96,150 tokens: under CAP, 150 batches
BIG_TOKENS = 150 * 641
SHORT = [42] * 8                # 16 of these make one batch of 128 tokens


class _AfterChecks(CancelFlag):
    """A flag that reads as set from its (n+1)-th check: the client leaves
    after exactly n batches."""

    def __init__(self, n: int):
        super().__init__()
        self.n, self.checks = n, 0

    @property
    def cancelled(self) -> bool:
        self.checks += 1
        return self.checks > self.n


# ---- runtime ------------------------------------------------------------------------


def test_a_cancelled_request_stops_between_batches(llm):
    before = llm.stats()
    with pytest.raises(Cancelled):
        embed_tokens(llm, [SHORT] * 160, cancel=_AfterChecks(2))
    after = llm.stats()
    assert after.embed_tokens - before.embed_tokens == 2 * 16 * 8    # 2 of its 10 batches
    assert after.embed_requests["cancelled"] == before.embed_requests["cancelled"] + 1


def test_the_request_of_finding_5_is_over_the_default_cap(llm):
    width = embedder(llm).n_tokens
    assert 64 * width > Settings().embed_max_tokens
    before = llm.stats().embed_tokens
    with pytest.raises(InvalidParams, match="at most 65,536") as e:
        embed_tokens(llm, [[42] * width] * 64)
    assert e.value.param == "input"
    assert llm.stats().embed_tokens == before           # refused before any batch


def test_a_small_caller_runs_between_a_large_callers_batches(llm):
    flag = CancelFlag()
    big: dict = {}

    def run_big():
        try:
            big["result"] = embed_tokens(llm, [SHORT] * 256, cancel=flag)   # 16 batches
        except Cancelled:
            big["cancelled"] = True

    start = llm.stats().embed_tokens
    thread = threading.Thread(target=run_big, daemon=True)
    thread.start()
    _wait_for(lambda: llm.stats().embed_tokens > start, "the large request to start")
    vectors, n = embed_tokens(llm, [[7, 8, 9]])
    # The small one was answered while the large one still had batches to go.
    assert len(vectors) == 1 and n == 3
    assert llm.stats().embed_tokens - start < 256 * 8 + 3
    assert "result" not in big
    flag.close()
    thread.join(WAIT_S)
    assert big == {"cancelled": True}


# ---- over HTTP ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def served(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "1024", "--max-num-seqs", "2",
                             "--no-prefix-cache",
                             env={"LLMCTL_HOME": str(session_home),
                                  "LLMCTL_EMBED_MAX_TOKENS": str(CAP)}) as srv:
        yield srv


def _stats(srv: Server) -> dict:
    return httpx.get(f"{srv.url}/stats", timeout=WAIT_S).json()


def _wait_for(cond, what: str):
    return wait_until(cond, what, WAIT_S, interval=0.1)


def _open_request(srv: Server, path: str, body: dict) -> socket.socket:
    """Send a request on a raw socket and leave it open: closing it is the
    client hanging up mid-request."""
    data = json.dumps(body).encode()
    sock = socket.create_connection(("127.0.0.1", srv.port), timeout=WAIT_S)
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{srv.port}\r\n"
                 f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
                 .encode() + data)
    return sock


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
def test_a_client_that_hangs_up_stops_the_work(served, path):
    before = _stats(served)
    sock = _open_request(served, path, {"input": BIG})
    _wait_for(lambda: _stats(served)["embedding_tokens"] > before["embedding_tokens"],
              "the request to start computing")
    sock.close()
    _wait_for(lambda: _stats(served)["embedding_requests"]["cancelled"]
              == before["embedding_requests"]["cancelled"] + 1, "the request to be cancelled")
    after = _stats(served)
    assert after["embedding_tokens"] - before["embedding_tokens"] < BIG_TOKENS
    assert after["embedding_requests"]["ok"] == before["embedding_requests"]["ok"]
    # It stays stopped, and the model still answers.
    r = httpx.post(f"{served.url}/v1/embeddings", json={"input": "still here"}, timeout=WAIT_S)
    assert r.status_code == 200
    assert _stats(served)["embedding_tokens"] - after["embedding_tokens"] == \
        r.json()["usage"]["prompt_tokens"]


@pytest.mark.slow
def test_a_small_request_is_served_while_a_large_one_runs(served):
    before = _stats(served)
    sock = _open_request(served, "/v1/embeddings", {"input": BIG})
    try:
        _wait_for(lambda: _stats(served)["embedding_tokens"] > before["embedding_tokens"],
                  "the large request to start computing")
        r = httpx.post(f"{served.url}/v1/embeddings", json={"input": "a small one"},
                       timeout=WAIT_S)
        assert r.status_code == 200 and len(r.json()["data"]) == 1
        during = _stats(served)
        # Only the small one has finished; the large one is still short of its tokens.
        assert during["embedding_requests"]["ok"] == before["embedding_requests"]["ok"] + 1
        assert during["embedding_tokens"] - before["embedding_tokens"] < BIG_TOKENS
    finally:
        sock.close()
    _wait_for(lambda: _stats(served)["embedding_requests"]["cancelled"]
              > before["embedding_requests"]["cancelled"], "the large request to be cancelled")


@pytest.mark.parametrize("path", ["/v1/embeddings", "/api/embed"])
def test_over_the_token_cap_is_a_400_naming_input(served, path):
    before = _stats(served)["embedding_tokens"]
    r = httpx.post(f"{served.url}{path}", json={"input": [LONG_TEXT] * 200}, timeout=WAIT_S)
    assert r.status_code == 400
    error = r.json()["error"]
    if path.startswith("/api/"):
        assert "at most 200,000" in error          # Ollama's {"error": "..."}
    else:
        assert error["param"] == "input" and "at most 200,000" in error["message"]
    assert _stats(served)["embedding_tokens"] == before


def test_ollama_legacy_embeddings_route(served):
    r = httpx.post(f"{served.url}/api/embeddings", json={"prompt": "The cat sat."},
                   timeout=WAIT_S)
    assert r.status_code == 200
    vector = np.array(r.json()["embedding"])
    assert vector.shape == (576,) and abs(np.linalg.norm(vector) - 1) < 1e-4
    r = httpx.post(f"{served.url}/api/embeddings", json={"prompt": ""}, timeout=WAIT_S)
    assert r.json() == {"embedding": []}
    r = httpx.post(f"{served.url}/api/embeddings", json={"prompt": 3}, timeout=WAIT_S)
    assert r.status_code == 400 and "prompt" in r.json()["error"]
