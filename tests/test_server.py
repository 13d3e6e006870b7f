"""`llmctl serve` with the real model: the official openai client, raw HTTP
for SSE framing and error bodies, concurrency, disconnects and a full queue."""

import concurrent.futures as cf
import contextlib
import json
import socket
import time

import httpx
import openai
import pytest
from near_tie import assert_greedy_agree, top_from_openai

from tests.conftest import ServerProcess

MSG = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def test_openai_client_non_streaming(client):
    r = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=16, temperature=0)
    assert r.object == "chat.completion" and r.model == "smollm2"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 10 and 0 < r.usage.completion_tokens <= 16
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens


def test_openai_client_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=16,
                                          temperature=0).choices[0].message.content
    chunks = list(client.chat.completions.create(
        model="smollm2", messages=MSG, max_tokens=16, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0
    assert chunks[-2].choices[0].finish_reason in ("stop", "length")


def test_completions_endpoint(client):
    r = client.completions.create(model="smollm2", prompt="The capital of France is",
                                  max_tokens=8, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    assert r.usage.completion_tokens <= 8


def test_models_health_metrics(server, client):
    assert [m.id for m in client.models.list().data] == ["smollm2"]
    assert httpx.get(server.url + "/health").json()["status"] == "ok"
    metrics = httpx.get(server.url + "/metrics").text
    for name in ("llmctl_requests_running", "llmctl_requests_waiting",
                 "llmctl_prompt_tokens_total", "llmctl_generation_tokens_total",
                 "llmctl_time_to_first_token_seconds_bucket",
                 "llmctl_inter_token_latency_seconds_count"):
        assert name in metrics
    assert "llmctl_generation_tokens_total 0" not in metrics


def test_raw_sse_framing(server):
    body = {"messages": MSG, "max_tokens": 6, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        raw = r.read().decode()
    events = raw.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    payloads = [json.loads(e[len("data: "):]) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert all(p["object"] == "chat.completion.chunk" for p in payloads)
    assert len({p["id"] for p in payloads}) == 1
    assert payloads[-1]["choices"][0]["finish_reason"] in ("stop", "length")


@pytest.mark.parametrize("body,status,param", [
    (b"{not json", 400, None),
    ({"model": "smollm2"}, 400, "messages"),
    ({"messages": "hi"}, 400, "messages"),
    ({"messages": MSG, "max_tokens": 0}, 400, "max_tokens"),
    ({"messages": MSG, "temperature": -1}, 400, "temperature"),
    ({"messages": MSG, "temperature": "warm"}, 400, "temperature"),
    ({"messages": MSG, "stop": 5}, 400, "stop"),
    ({"messages": MSG, "stream": "yes"}, 400, "stream"),
    ({"messages": MSG, "max_tokens": 5000}, 400, "max_tokens"),
    ({"messages": MSG, "model": "gpt-4o"}, 404, "model"),
])
def test_bad_requests_get_openai_errors(server, body, status, param):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + "/v1/chat/completions", content=content,
                   headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["param"] == param and err["message"]
    if param == "max_tokens" and status == 400 and "5000" in json.dumps(body):
        assert "5000" in err["message"] and "1024" in err["message"]


def test_completions_prompt_required(server):
    r = httpx.post(server.url + "/v1/completions", json={"max_tokens": 4})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_eight_parallel_greedy_streams_equal_each_alone(client, exactness):
    prompts = [f"Say something about the number {i}." for i in range(8)]

    def ask(p):
        return client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": p}], max_tokens=20,
            temperature=0, logprobs=True, top_logprobs=5).choices[0]

    alone = [ask(p) for p in prompts]
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(ask, prompts))
    # The `server` fixture keeps no prefix cache, so flash attention is on:
    # identical where this machine's rows are exact there, else up to a near-tie.
    for ref, got in zip(alone, together, strict=False):
        content = [c.model_dump() for c in ref.logprobs.content]
        assert_greedy_agree(exactness(flash_attn=True), [c["token"] for c in content],
                            got.message.content, top_from_openai(content), ref.message.content)


def _running(server) -> int:
    for line in httpx.get(server.url + "/metrics").text.splitlines():
        if line.startswith("llmctl_requests_running "):
            return int(line.split()[1])
    raise AssertionError("metric missing")


def test_client_disconnect_frees_its_slot(server):
    body = json.dumps({"messages": MSG, "max_tokens": 900, "ignore_eos": True,
                       "stream": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                 b"application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    assert b"200" in sock.recv(4096)
    deadline = time.time() + 20
    while _running(server) != 1 and time.time() < deadline:
        time.sleep(0.05)
    assert _running(server) == 1
    sock.close()
    deadline = time.time() + 20
    while _running(server) and time.time() < deadline:
        time.sleep(0.1)
    assert _running(server) == 0


def test_full_queue_gets_503_with_retry_after(server):
    # 8 slots + 4 queue places: once 12 long requests hold them, the next gets 503.
    body = {"messages": MSG, "max_tokens": 900, "ignore_eos": True, "stream": True}
    with contextlib.ExitStack() as stack:
        for _ in range(12):
            r = stack.enter_context(httpx.stream("POST", server.url + "/v1/chat/completions",
                                                 json=body, timeout=600))
            assert r.status_code == 200
        deadline = time.time() + 120
        while time.time() < deadline:
            s = httpx.get(server.url + "/stats").json()
            if (s["requests_running"], s["requests_waiting"]) == (8, 4):
                break
            time.sleep(0.05)
        rejected = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)
    assert rejected.status_code == 503
    error = rejected.json()["error"]
    assert rejected.headers["retry-after"] and error["type"] == "service_unavailable", error
    assert error["code"] == "server_busy" and "--max-queued 4" in error["message"], error


def test_api_key_required(session_home):
    srv = ServerProcess(["smollm2", "--ctx-size", "256", "--max-num-seqs", "1",
                         "--api-key", "s3cret", "--no-prefix-cache"],
                        env={"LLMCTL_HOME": str(session_home)})
    try:
        srv.wait_ready()
        assert httpx.get(srv.url + "/v1/models").status_code == 401
        bad = httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer nope"})
        assert bad.status_code == 401 and bad.json()["error"]["type"] == "authentication_error"
        good = openai.OpenAI(base_url=srv.url + "/v1", api_key="s3cret", max_retries=0)
        assert good.chat.completions.create(model="smollm2", messages=MSG, max_tokens=2).usage
    finally:
        srv.stop()


def test_port_in_use_is_a_clear_error(server, session_home):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "llmctl", "serve", "smollm2", "--port", str(server.port)],
                       capture_output=True, text=True, timeout=60,
                       env={**__import__("os").environ, "LLMCTL_HOME": str(session_home)})
    assert r.returncode == 2 and "already in use" in r.stderr and "Traceback" not in r.stderr


def test_tokenize_round_trip(server):
    toks = httpx.post(server.url + "/tokenize", json={"content": "Hello world"}).json()["tokens"]
    assert len(toks) == 2
    back = httpx.post(server.url + "/detokenize", json={"tokens": toks}).json()["content"]
    assert back == "Hello world"
    assert httpx.post(server.url + "/detokenize", json={"tokens": [-1]}).status_code == 400
