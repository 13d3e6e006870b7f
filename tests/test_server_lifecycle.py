"""Requests whose clients go away, and streams kept alive through a long
prefill, against a real `llmctl serve`."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from conftest import ServerProcess

LONG = {"prompt": "Tell me a story", "max_tokens": 900, "ignore_eos": True, "temperature": 0}


@pytest.fixture(scope="module")
def keepalive_server(session_home):
    # Keep-alive comments every 50 ms, so any prefill is long enough to show them.
    srv = ServerProcess(["smollm2", "--ctx-size", "1024", "--max-num-seqs", "4",
                         "--max-num-batched-tokens", "64", "--no-prefix-cache", "--threads", "1"],
                        env={"LLMCTL_HOME": str(session_home), "LLMCTL_SSE_KEEPALIVE_S": "0.05"})
    try:
        yield srv.wait_ready()
    finally:
        srv.stop()


def stats(srv) -> dict:
    return httpx.get(srv.url + "/stats", timeout=10).json()


def wait_idle(srv, deadline_s: float = 60) -> dict:
    """Poll until nothing runs; a generous deadline, not a speed bound."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        s = stats(srv)
        if s["requests_running"] == 0 and s["requests_waiting"] == 0:
            return s
        time.sleep(0.1)
    raise AssertionError(f"requests still running: {stats(srv)}")


def test_an_abandoned_non_streaming_request_frees_its_slot(keepalive_server):
    before = stats(keepalive_server)
    with pytest.raises(httpx.TimeoutException):
        # The SDK-style client gives up after 1 s without an answer.
        httpx.post(keepalive_server.url + "/v1/completions", json=LONG,
                   timeout=httpx.Timeout(30, read=1.0))
    after = wait_idle(keepalive_server)
    assert after["requests"]["cancelled"] == before["requests"]["cancelled"] + 1
    # It stopped early: far fewer tokens than the 900 it asked for.
    assert after["generation_tokens"] - before["generation_tokens"] < 900


def test_sse_keepalive_comments_while_a_long_prompt_prefills(keepalive_server):
    prompt = " ".join(["the quick brown fox jumps over the lazy dog"] * 80)
    body = {"prompt": prompt, "max_tokens": 4, "temperature": 0, "stream": True}
    lines = []
    with httpx.stream("POST", keepalive_server.url + "/v1/completions", json=body,
                      timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    data = [line[6:] for line in lines if line.startswith("data: ")]
    assert comments, "no keep-alive comment during a multi-chunk prefill"
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
