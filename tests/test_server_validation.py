"""`llmctl serve` refuses what it must: requests without the API key, foreign
origins and rebound hosts, oversized bodies, JSON that Python accepts but
no peer should send, mistyped and unsupported fields. Raw HTTP against the
real server, so every layer (uvicorn, middleware, handlers) is exercised."""

import json
import socket

import httpx
import openai
import pytest

from llmctl.bench.launcher import Server

MSG = [{"role": "user", "content": "Hi"}]
KEY = "s3cret"
SMALL = ["smollm2", "--ctx-size", "256", "--max-num-seqs", "1", "--no-prefix-cache"]


@pytest.fixture(scope="module")
def guarded(session_home):
    """Key required, one extra allowed origin, a 64 KiB body cap."""
    with Server.llmctl_serve(*SMALL, "--api-key", KEY, "--max-body-mb", "0.0625",
                             env={"LLMCTL_HOME": str(session_home),
                                  "LLMCTL_ALLOWED_ORIGINS": "https://app.example.com"}) as srv:
        yield srv


def post(server, body, path="/v1/chat/completions", **kw) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + path, content=content, timeout=300,
                      headers={"content-type": "application/json", **kw.pop("headers", {})}, **kw)


def assert_error(r: httpx.Response, status: int, param=None, code=None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    assert err["param"] == param, err
    if code:
        assert err["code"] == code
    return err


# ---- the API key --------------------------------------------------------------

ROUTES = [("GET", "/v1/models"), ("POST", "/v1/chat/completions"), ("POST", "/v1/completions"),
          ("POST", "/tokenize"), ("POST", "/detokenize"), ("GET", "/metrics"), ("GET", "/stats"),
          ("GET", "/openapi.json"), ("GET", "/no-such-route")]


@pytest.mark.parametrize("method,path", ROUTES)
def test_every_route_but_health_needs_the_key(guarded, method, path):
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": KEY}):
        r = httpx.request(method, guarded.url + path, headers=headers, json={})
        assert r.json()["error"]["type"] == "authentication_error"
        assert_error(r, 401, code="invalid_api_key")
    ok = httpx.request(method, guarded.url + path, json={},
                       headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code != 401
    assert httpx.get(guarded.url + "/health").status_code == 200


@pytest.mark.parametrize("method,path", [("GET", "/api/ps"), ("POST", "/api/chat"),
                                         ("GET", "/api/no-such-route")])
def test_ollama_routes_answer_errors_in_ollama_shape(guarded, method, path):
    # Ollama's clients read {"error": "..."}: the key check speaks it on /api/*.
    r = httpx.request(method, guarded.url + path, json={})
    assert r.status_code == 401 and isinstance(r.json()["error"], str)
    ok = httpx.request(method, guarded.url + path, json={},
                       headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code != 401
    if ok.status_code >= 400:
        assert isinstance(ok.json()["error"], str)


def test_metrics_public_opens_metrics_only(session_home):
    with Server.llmctl_serve(*SMALL, "--api-key", KEY, "--metrics-public",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        r = httpx.get(srv.url + "/metrics")
        assert r.status_code == 200 and "llmctl_requests_running" in r.text
        assert httpx.get(srv.url + "/stats").status_code == 401
        assert httpx.get(srv.url + "/v1/models").status_code == 401


def test_the_key_works_through_the_openai_client(guarded):
    good = openai.OpenAI(base_url=guarded.url + "/v1", api_key=KEY, max_retries=0)
    assert good.chat.completions.create(model="smollm2", messages=MSG, max_tokens=2).usage
    bad = openai.OpenAI(base_url=guarded.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


# ---- origins and hosts (DNS rebinding) -------------------------------------------

@pytest.mark.parametrize("headers", [
    {"Origin": "https://evil.example"},
    {"Origin": "http://localhost.evil.example"},
    {"Origin": "null"},
    {"Host": "evil.example"},
    {"Host": "rebind.evil.example:8000"},
])
def test_foreign_origin_or_host_is_refused(server, headers):
    for path in ("/health", "/v1/models"):
        err = assert_error(httpx.get(server.url + path, headers=headers), 403, code="forbidden")
        assert err["type"] == "permission_error"


@pytest.mark.parametrize("headers", [
    {}, {"Origin": "http://localhost:5173"}, {"Origin": "http://127.0.0.1:3000"},
    {"Origin": "http://[::1]:8080"}, {"Host": "localhost:1234"}, {"Host": "127.0.0.1"},
    {"Host": "[::1]:80"}, {"Host": "192.168.1.20:8000"},
])
def test_local_origins_and_hosts_and_plain_clients_pass(server, headers):
    r = httpx.get(server.url + "/v1/models", headers=headers)
    assert r.status_code == 200, r.text
    if "Origin" in headers:   # a browser page on localhost may read the answer
        assert r.headers["access-control-allow-origin"] in ("*", headers["Origin"])


def test_allowed_origin_passes_and_its_preflight_needs_no_key(guarded):
    origin = {"Origin": "https://app.example.com"}
    pre = httpx.options(guarded.url + "/v1/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert pre.status_code == 200 and pre.headers["access-control-allow-origin"]
    r = post(guarded, {"messages": MSG, "max_tokens": 1},
             headers={**origin, "Authorization": f"Bearer {KEY}"})
    assert r.status_code == 200, r.text
    assert_error(httpx.get(guarded.url + "/v1/models",
                           headers={"Origin": "https://other.example.com",
                                    "Authorization": f"Bearer {KEY}"}), 403, code="forbidden")


# ---- the body cap ------------------------------------------------------------------

def _raw_response(sock: socket.socket) -> tuple[int, dict]:
    data = b""
    while b"\r\n\r\n" not in data or not data.rstrip().endswith(b"}"):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


def test_content_length_over_the_cap_is_413_before_the_body_is_sent(server):
    # The default cap is 8 MiB; only the headers go out, and the answer must
    # come without the server waiting for the 9 MiB it was promised.
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 9437184\r\n\r\n")
        status, body = _raw_response(sock)
    assert status == 413 and body["error"]["code"] == "payload_too_large"


def test_chunked_body_over_the_cap_is_413_while_it_streams(guarded):
    # 80 KiB in 16 KiB chunks against a 64 KiB cap, and the body is never
    # finished: only counting as it streams can answer.
    with socket.create_connection(("127.0.0.1", guarded.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + KEY.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        for _ in range(5):
            sock.sendall(b"4000\r\n" + b" " * 0x4000 + b"\r\n")
        status, body = _raw_response(sock)
    assert status == 413 and body["error"]["code"] == "payload_too_large"
    ok = post(guarded, {"messages": MSG, "max_tokens": 1},
              headers={"Authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200


# ---- JSON that Python parses but must not pass ------------------------------------

@pytest.mark.parametrize("raw,param", [
    (b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": NaN}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": Infinity}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e999}', "temperature"),
    (b'{"messages": [{"role": "user", "content": "Hi"}], "top_p": -Infinity}', "top_p"),
])
def test_non_finite_numbers_are_400(server, raw, param):
    assert_error(post(server, raw), 400, param)


def test_deep_nesting_is_400_not_500(server):
    assert_error(post(server, b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"), 400,
                 "messages")
    assert_error(post(server, {"messages": MSG, "metadata": json.loads("[" * 500 + "]" * 500)}),
                 400, "metadata")


@pytest.mark.parametrize("path,raw,param", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800b"}]}',
     "messages"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\\udfff"}]}]}',
     "messages"),
    ("/v1/chat/completions",
     b'{"messages": [{"role": "user", "content": "Hi"}], "stop": ["\\ud800"]}', "stop"),
    ("/v1/completions", b'{"prompt": "\\ud83d", "max_tokens": 1}', "prompt"),
    ("/tokenize", b'{"content": "\\ud83d"}', "content"),
])
def test_lone_surrogates_are_400(server, path, raw, param):
    assert_error(post(server, raw, path), 400, param)


# ---- field validation ---------------------------------------------------------------

@pytest.mark.parametrize("extra,param", [
    ({"model": []}, "model"),
    ({"model": 5}, "model"),
    ({"n": 1.0}, "n"),
    ({"n": True}, "n"),
    ({"n": 17}, "n"),
    ({"n": 0}, "n"),
    ({"logprobs": 1}, "logprobs"),
    ({"top_logprobs": 3}, "top_logprobs"),                     # needs logprobs: true
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"stream": 1}, "stream"),
    ({"stream_options": {"include_usage": "yes"}}, "stream_options"),
    ({"max_tokens": 2.0}, "max_tokens"),
    ({"max_completion_tokens": 1, "max_tokens": "x"}, "max_tokens"),
    ({"top_k": 2**40}, "top_k"),
    ({"seed": 1.5}, "seed"),
    ({"temperature": True}, "temperature"),
])
def test_mistyped_fields_are_400_naming_them(server, extra, param):
    assert_error(post(server, {"messages": MSG, "max_tokens": 1, **extra}), 400, param)


UNSUPPORTED = [
    ("functions", [{"name": "f"}]),
    ("function_call", "auto"),
    ("best_of", 2),
    ("echo", True),
    ("suffix", "tail"),
]


@pytest.mark.parametrize("field,value", UNSUPPORTED)
def test_unsupported_fields_are_named_not_dropped(server, field, value):
    path, base = (("/v1/completions", {"prompt": "Hi"}) if field in ("best_of", "echo", "suffix")
                  else ("/v1/chat/completions", {"messages": MSG}))
    err = assert_error(post(server, {**base, "max_tokens": 1, field: value}, path), 400, field)
    assert "not supported" in err["message"]


@pytest.mark.parametrize("extra,param", [
    ({"logprobs": True}, "logprobs"),              # a chat field: completions take N
    ({"logprobs": 21}, "logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"n": 2, "best_of": 3}, "best_of"),
])
def test_completions_logprobs_and_best_of_are_checked(server, extra, param):
    assert_error(post(server, {"prompt": "Hi", "max_tokens": 1, **extra}, "/v1/completions"),
                 400, param)


@pytest.mark.parametrize("extra,param,says", [
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools",
     "does not support tools"),                     # SmolLM2's template has no tools
    ({"tool_choice": "required"}, "tool_choice", "tool"),
    ({"logit_bias": {"50256": -100}}, "logit_bias", "outside the vocabulary"),
    ({"logit_bias": {"7": 101}}, "logit_bias", "-100 to 100"),
    ({"response_format": {"type": "xml"}}, "response_format", "xml"),
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "n", "schema": {"type": "string", "pattern": "(?=a)"}}}}, "response_format",
     "lookaround"),
])
def test_structured_fields_are_checked_and_named(server, extra, param, says):
    err = assert_error(post(server, {"messages": MSG, "max_tokens": 1, **extra}), 400, param)
    assert says in err["message"]


def test_json_object_answers_parse(server):
    r = post(server, {"messages": [{"role": "user", "content": "Describe a cat in JSON."}],
                      "max_tokens": 60, "temperature": 0, "response_format": {"type": "json_object"}})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:       # cut by max_tokens: still a prefix of a JSON object
        assert choice["message"]["content"].lstrip().startswith("{")


def test_nulls_mean_defaults_and_harmless_extras_pass(server):
    body = {"messages": MSG, "max_tokens": 1, "stream": None, "stream_options": None,
            "temperature": None, "stop": None, "n": None, "seed": None, "tools": None,
            "logprobs": False, "logit_bias": {}, "response_format": {"type": "text"},
            "user": "u1", "metadata": {"k": "v"}, "store": False, "service_tier": "auto"}
    r = post(server, body)
    assert r.status_code == 200, r.text
    assert r.json()["object"] == "chat.completion"


@pytest.mark.parametrize("content", [
    [{"type": "text", "text": 5}],
    [{"type": "text", "text": None}],
    [{"type": "text"}],
    [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}],
    ["just a string"],
    {"type": "text", "text": "an object, not a list"},
])
def test_bad_content_parts_are_400(server, content):
    assert_error(post(server, {"messages": [{"role": "user", "content": content}],
                               "max_tokens": 1}), 400, "messages")


@pytest.mark.parametrize("message", [
    {"content": "no role"}, {"role": 5, "content": "x"}, {"role": "", "content": "x"},
    "not an object",
    {"role": "assistant", "content": None,
     "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f"}}]},
])
def test_bad_messages_are_400(server, message):
    assert_error(post(server, {"messages": [message], "max_tokens": 1}), 400, "messages")
