"""Bursts are queued and answered, never shed: hundreds of requests sent at
once through the official clients all get their answer; only a configured
bound (--max-queued, --max-queued-mb) refuses one, with a 503 and
Retry-After in the protocol's own shape; a client that leaves while queued
takes its request with it. Against real `llmctl serve smollm2` processes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import time
from collections import Counter

import anthropic
import httpx
import ollama
import openai
import pytest

from conftest import wait_until
from llmctl.bench.launcher import Server

MSG = [{"role": "user", "content": "Say hi"}]
BURST = 300


@pytest.fixture(scope="module")
def burst_server(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "512", "--max-num-seqs", "16",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv


def _queue(url: str) -> dict:
    return httpx.get(url + "/stats", timeout=30).json()["queue"]


async def _health_while(url: str, done: asyncio.Event) -> list[int]:
    """/health's status every 50 ms until `done`: GETs are never queued."""
    codes = []
    async with httpx.AsyncClient(timeout=30) as http:
        while not done.is_set():
            codes.append((await http.get(url + "/health")).status_code)
            await asyncio.sleep(0.05)
    return codes


async def _gather_with_health(url: str, calls: list) -> tuple[list, list[int]]:
    done = asyncio.Event()
    health = asyncio.create_task(_health_while(url, done))
    try:
        results = await asyncio.gather(*calls, return_exceptions=True)
    finally:
        done.set()
    return results, await health


def _statuses(results: list) -> Counter:
    """200 for an answer, else the error's status (or its type)."""
    out: Counter = Counter()
    for r in results:
        if not isinstance(r, BaseException):
            out[200] += 1
        else:
            out[getattr(r, "status_code", type(r).__name__)] += 1
    return out


@pytest.mark.slow
def test_300_openai_requests_at_once_are_all_answered(burst_server):
    async def scenario():
        client = openai.AsyncOpenAI(base_url=burst_server.url + "/v1", api_key="x",
                                    max_retries=0, timeout=600)
        calls = [client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": f"Count to {i}"}],
            max_tokens=2, temperature=0) for i in range(BURST)]
        async with client:
            return await _gather_with_health(burst_server.url, calls)

    results, health = asyncio.run(scenario())
    assert _statuses(results) == {200: BURST}, _statuses(results)
    assert all(r.choices[0].message.content is not None for r in results)
    assert health and set(health) == {200}, Counter(health)
    queue = _queue(burst_server.url)
    assert (queue["queued"], queue["in_flight"], queue["refused"]) == (0, 0, 0), queue


@pytest.mark.slow
def test_300_ollama_and_anthropic_requests_at_once_are_all_answered(burst_server):
    async def scenario():
        olla = ollama.AsyncClient(host=burst_server.url, timeout=600)
        claude = anthropic.AsyncAnthropic(base_url=burst_server.url, api_key="x",
                                          max_retries=0, timeout=600)
        calls = []
        for i in range(BURST // 2):     # interleaved: neither protocol goes first
            calls.append(olla.chat(model="smollm2", messages=[
                {"role": "user", "content": f"Name {i}"}], options={"num_predict": 2}))
            calls.append(claude.messages.create(model="smollm2", max_tokens=2, messages=[
                {"role": "user", "content": f"Spell {i}"}]))
        async with claude:
            return await _gather_with_health(burst_server.url, calls)

    results, health = asyncio.run(scenario())
    assert _statuses(results) == {200: BURST}, _statuses(results)
    assert [r.message.role for r in results[::2]] == ["assistant"] * (BURST // 2)
    assert {r.type for r in results[1::2]} == {"message"}
    assert set(health) == {200}, Counter(health)
    text = httpx.get(burst_server.url + "/metrics", timeout=30).text
    assert "llmctl_queue_requests 0" in text and "llmctl_queue_refused_total 0" in text, text


@contextlib.contextmanager
def _long_streams(url: str, n: int):
    """`n` long streamed chats, open: the first holds the one slot, the
    rest wait in the queue. Closed (cancelled) on leaving."""
    body = {"model": "smollm2", "messages": MSG, "max_tokens": 3000, "ignore_eos": True,
            "stream": True}
    with contextlib.ExitStack() as stack:
        client = stack.enter_context(httpx.Client(timeout=600))
        for _ in range(n):
            r = stack.enter_context(client.stream("POST", url + "/v1/chat/completions",
                                                  json=body))
            assert r.status_code == 200
        yield


@contextlib.contextmanager
def _slow_upload(url: str, declared: int, sent: int):
    """A request that declares `declared` body bytes and sends `sent` of
    them, held open: it is queued, holding its body, until we hang up."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(declared).encode() + b"\r\n\r\n" + b" " * sent)
        yield


BUSY_PATHS = {
    "/v1/chat/completions": {"model": "smollm2", "messages": MSG, "max_tokens": 1},
    "/v1/completions": {"model": "smollm2", "prompt": "Hi", "max_tokens": 1},
    "/v1/responses": {"model": "smollm2", "input": "Hi", "max_output_tokens": 16},
    "/v1/messages": {"model": "smollm2", "messages": MSG, "max_tokens": 1},
    "/api/chat": {"model": "smollm2", "messages": MSG, "stream": False},
    "/api/generate": {"model": "smollm2", "prompt": "Hi", "stream": False},
}


def _assert_busy(path: str, r: httpx.Response, says: str) -> None:
    """A refusal for load: retryable, in the route's own error shape."""
    assert r.headers.get("retry-after"), (path, r.headers)
    if path == "/v1/messages":          # Anthropic's "overloaded", which its clients retry
        assert r.status_code == 529, r.text
        assert r.json()["type"] == "error" and r.json()["error"]["type"] == "overloaded_error"
        message = r.json()["error"]["message"]
    elif path.startswith("/api/"):
        assert r.status_code == 503 and set(r.json()) == {"error"}, r.text
        message = r.json()["error"]
    else:
        assert r.status_code == 503, r.text
        error = r.json()["error"]
        assert (error["type"], error["code"]) == ("service_unavailable", "server_busy"), error
        message = error["message"]
    assert says in message, message


@pytest.mark.slow
def test_a_full_queue_is_a_503_with_retry_after_in_each_protocols_shape(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "4096", "--max-num-seqs", "1",
                             "--max-queued", "2", "--max-queued-mb", "1", "--max-body-mb", "0.2",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        # By count: one stream runs, two wait; the next request is refused.
        with _long_streams(srv.url, 3):
            wait_until(lambda: _queue(srv.url)["queued"] == 2, "two queued streams", 60)
            for path, body in BUSY_PATHS.items():
                _assert_busy(path, httpx.post(srv.url + path, json=body, timeout=60),
                             "--max-queued 2")
            assert httpx.get(srv.url + "/health", timeout=5).status_code == 200
            shown = _llmctl("ps", "--url", srv.url)
            row = next(line for line in shown.stdout.splitlines() if "smollm2" in line)
            assert " 1/1 " in row and " 2 " in row, shown.stdout      # SLOTS 1/1, QUEUED 2
            assert "queue: 2 of 2 waiting" in shown.stdout, shown.stdout
            assert "6 refused since start" in shown.stdout, shown.stdout
            queue = json.loads(_llmctl("ps", "--url", srv.url, "--json").stdout)["queue"]
            assert (queue["queued"], queue["by_model"]) == (2, {"smollm2": 2}), queue
        wait_until(lambda: _queue(srv.url)["queued"] == 0, "an empty queue", 60)
        # By memory: a slow upload holds 200 kB of body (charged four times
        # over for its parsed form); another 150 kB does not fit in 1 MiB.
        padded = {path: {**body, "pad": "x" * 150_000} for path, body in BUSY_PATHS.items()}
        with _slow_upload(srv.url, 200_000, 100_000):
            wait_until(lambda: _queue(srv.url)["queued_bytes"] > 800_000, "a body held", 30)
            for path, body in padded.items():
                _assert_busy(path, httpx.post(srv.url + path, json=body, timeout=60),
                             "--max-queued-mb 1")
        # Once it hangs up, the same body is admitted and answered.
        wait_until(lambda: _queue(srv.url)["in_flight"] == 0, "the upload gone", 30)
        r = httpx.post(srv.url + "/v1/chat/completions", json=padded["/v1/chat/completions"],
                       timeout=60)
        assert r.status_code == 200, r.text
        assert _queue(srv.url)["refused"] == 2 * len(BUSY_PATHS)


def _llmctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "llmctl", *args], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "COLUMNS": "100"})


def test_a_memory_bound_that_cannot_hold_one_body_stops_serve_at_once():
    r = _llmctl("serve", "smollm2", "--max-queued-mb", "4", "--max-body-mb", "8")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.strip().splitlines() == [
        "error: --max-queued-mb 4 cannot hold one request of --max-body-mb 8 (that needs "
        "32.0 MiB)"], r.stderr


def _post_and_leave(url: str, body: bytes) -> None:
    """Send a whole request, then hang up without reading the answer."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        time.sleep(0.5)


@pytest.mark.slow
def test_a_queued_request_whose_client_leaves_never_runs(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "4096", "--max-num-seqs", "1",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        with _long_streams(srv.url, 1):
            body = httpx.Request("POST", "/", json={"model": "smollm2", "messages": MSG,
                                                    "max_tokens": 5}).content
            for _ in range(3):
                _post_and_leave(srv.url, body)
            # Gone from the server's queue and the engine's both.
            wait_until(lambda: _queue(srv.url)["in_flight"] == 1, "only the stream in flight",
                       30)
            # The engine drops a cancelled request at its next step.
            wait_until(lambda: httpx.get(srv.url + "/stats", timeout=30).json()
                       ["requests_waiting"] == 0, "no request waiting in the engine", 30)
        done = httpx.get(srv.url + "/stats", timeout=30).json()["requests"]
        assert done["ok"] == 0, done            # the three never ran
        assert done["cancelled"] >= 1, done     # the stream, closed by us
