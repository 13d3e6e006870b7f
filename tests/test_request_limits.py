"""Every numeric and structured request field has a range (docs/limits.md),
and a value outside it is a 400 in the protocol's own error shape that names
the field, on the same keep-alive connection the next request then uses
(issue #20, findings 7, 10 and 11). Raw HTTP through one httpx.Client, plus
the openai and ollama clients, against a real `llmctl serve smollm2`."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import ollama
import openai
import pytest

MSG = [{"role": "user", "content": "Hi"}]
DEEP = "[" * 100_000 + "]" * 100_000          # 100,000 nested brackets


@pytest.fixture
def http(server):
    # A hung server fails the test instead of hanging the suite.
    with httpx.Client(base_url=server.url, timeout=120) as c:
        yield c


def _local_port(r: httpx.Response) -> int:
    """The client side's port of the connection `r` came on."""
    return r.extensions["network_stream"].get_extra_info("socket").getsockname()[1]


def refused(http: httpx.Client, path: str, body: dict, param: str | None) -> str:
    """POSTs `body`, asserts a 400 in the route's error shape naming `param`
    (OpenAI's `param` on /v1, the message on Ollama's /api/*), then that the
    same connection still answers. Returns the error message."""
    r = http.post(path, json=body)
    assert r.status_code == 400, r.text
    if path.startswith("/api/"):
        assert set(r.json()) == {"error"} and isinstance(r.json()["error"], str)
        message = r.json()["error"]
        assert param.split(".")[-1] in message, message
    else:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}, err
        assert err["type"] == "invalid_request_error" and err["param"] == param, err
        message = err["message"]
    assert r.headers.get("connection") != "close"
    after = http.get("/v1/models")
    assert after.status_code == 200
    assert _local_port(after) == _local_port(r), "the 400 dropped the keep-alive connection"
    return message


def chat(extra: dict) -> dict:
    return {"model": "smollm2", "messages": MSG, "max_tokens": 1, **extra}


# ---- finding 7 and the audit: every field's range, below and above ------------------

OPENAI_OUT_OF_RANGE = [
    ("temperature", -0.1), ("temperature", 100.5), ("temperature", 10**400),
    ("top_p", 0), ("top_p", 1.5),
    ("top_k", -1), ("top_k", 2**31),
    ("min_p", -0.1), ("min_p", 1.1),
    ("presence_penalty", -2.1), ("presence_penalty", 2.1),
    ("frequency_penalty", -2.1), ("frequency_penalty", 2.1),
    ("repeat_penalty", 0), ("repeat_penalty", 101),
    ("seed", -2**63 - 1), ("seed", 2**64),
    ("max_tokens", 0), ("max_tokens", 10**6),
    ("max_completion_tokens", 0), ("max_completion_tokens", 2**63),
    ("n", 0), ("n", 17),
    ("stop", ["s"] * 17), ("stop", ["x" * 257]),
]


@pytest.mark.parametrize("field,value", OPENAI_OUT_OF_RANGE,
                         ids=[f"{f}={str(v)[:12]}" for f, v in OPENAI_OUT_OF_RANGE])
def test_openai_fields_out_of_range_are_400_naming_them(http, field, value):
    # max_tokens over the context is context_length_exceeded, also a 400.
    param = "max_tokens" if field == "max_completion_tokens" and value > 1 else field
    body = chat({field: value})
    if field == "max_completion_tokens":
        del body["max_tokens"]
    refused(http, "/v1/chat/completions", body, param)


@pytest.mark.parametrize("extra,param", [
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"logit_bias": {str(i): 1 for i in range(1025)}}, "logit_bias"),
    ({"logit_bias": {"-1": 1}}, "logit_bias"),
    ({"logit_bias": {"2147483648": 1}}, "logit_bias"),
    ({"logit_bias": {"7": -101}}, "logit_bias"),
    ({"logit_bias": {"7": 101}}, "logit_bias"),
    ({"logit_bias": {"7": 10**400}}, "logit_bias"),    # math.isfinite(int) overflowed
    ({"tools": [{"type": "function", "function": {"name": f"f{i}"}} for i in range(129)]},
     "tools"),
])
def test_structured_fields_out_of_range_are_400_naming_them(http, extra, param):
    refused(http, "/v1/chat/completions", chat(extra), param)


@pytest.mark.parametrize("value", [-1, 21])
def test_completions_logprobs_out_of_range(http, value):
    refused(http, "/v1/completions", {"prompt": "Hi", "max_tokens": 1, "logprobs": value},
            "logprobs")


OLLAMA_OUT_OF_RANGE = [
    ("temperature", -1), ("temperature", 101), ("top_p", 0), ("top_p", 2),
    ("top_k", -1), ("top_k", 2**31), ("min_p", -0.5), ("min_p", 1.5),
    ("repeat_penalty", 0), ("repeat_penalty", 101),
    ("presence_penalty", -3), ("presence_penalty", 3),
    ("frequency_penalty", -3), ("frequency_penalty", 3),
    ("seed", 2**64), ("num_predict", 0), ("num_predict", -3), ("num_predict", 10**6),
    ("num_ctx", 0), ("num_ctx", 2**31), ("num_ctx", 4096),      # over the loaded 1024
    ("repeat_last_n", -2), ("repeat_last_n", 2**31),
    ("stop", ["s"] * 17), ("stop", ["x" * 257]),
    # Load-time and sampler knobs llmctl has no equivalent for: refused by name.
    ("num_keep", 5), ("num_batch", 512), ("num_gpu", 1), ("main_gpu", 0),
    ("num_thread", 4), ("typical_p", 0.5), ("tfs_z", 0.5), ("mirostat", 1),
    ("mirostat_tau", 5.0), ("mirostat_eta", 0.1), ("use_mmap", True), ("numa", True),
]


@pytest.mark.parametrize("option,value", OLLAMA_OUT_OF_RANGE,
                         ids=[f"{o}={str(v)[:12]}" for o, v in OLLAMA_OUT_OF_RANGE])
def test_ollama_options_out_of_range_are_400_naming_them(http, option, value):
    refused(http, "/api/chat", {"model": "smollm2", "messages": MSG, "stream": False,
                                "options": {option: value}}, f"options.{option}")


def _peak_rss(server) -> int:
    """The server's peak resident memory so far (VmHWM), in bytes."""
    status = Path(f"/proc/{server._proc.pid}/status").read_text()
    line = next(ln for ln in status.splitlines() if ln.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def test_repeat_last_n_is_bounded_by_the_context_not_by_its_value(server, http):
    """Finding 7: llama.cpp sized the penalty's buffer by repeat_last_n, so
    250,000,000 cost about 1 GB per request. Over the context it now means
    the context (as -1 does), and the request answers as it would."""
    opts = {"temperature": 0, "num_predict": 4, "repeat_penalty": 1.3}
    body = {"model": "smollm2", "messages": MSG, "stream": False}
    peak = _peak_rss(server)
    big = http.post("/api/chat", json={**body, "options": {**opts, "repeat_last_n": 250_000_000}})
    assert big.status_code == 200, big.text
    assert _peak_rss(server) - peak < 300 << 20
    whole = http.post("/api/chat", json={**body, "options": {**opts, "repeat_last_n": -1}})
    assert whole.status_code == 200, whole.text
    assert big.json()["message"]["content"] == whole.json()["message"]["content"]
    assert big.json()["eval_count"] == whole.json()["eval_count"]


# ---- finding 10: what was a 500 (and a dropped connection) -----------------------

def _history_with_arguments(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "Call f."},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "f", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "done"},
            {"role": "user", "content": "Thanks."}]


@pytest.mark.parametrize("bias", [{"²": 1}, {"1" * 5000: 1}, {"٣": 1}, {" 7": 1}],
                         ids=["superscript-two", "5000-digits", "arabic-three", "space"])
def test_logit_bias_keys_that_are_not_ascii_ids_are_400(http, bias):
    message = refused(http, "/v1/chat/completions", chat({"logit_bias": bias}), "logit_bias")
    assert "not a token id" in message and len(message) < 200


def test_deeply_nested_tool_call_arguments_in_history_are_400(http):
    message = refused(http, "/v1/chat/completions",
                      {"messages": _history_with_arguments(DEEP), "max_tokens": 1}, "messages")
    assert "messages[1].tool_calls[0].function.arguments" in message


def test_deeply_nested_tool_call_arguments_on_ollama_are_400(http):
    history = [{"role": "user", "content": "Call f."},
               {"role": "assistant", "content": "",
                "tool_calls": [{"function": {"name": "f", "arguments": DEEP}}]}]
    refused(http, "/api/chat", {"model": "smollm2", "messages": history, "stream": False},
            "arguments")


def test_the_openai_client_sees_a_400_then_carries_on(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1,
                                       logit_bias={"²": 1})
    assert e.value.param == "logit_bias"
    ok = client.chat.completions.create(model="smollm2", messages=MSG, max_tokens=1)
    assert ok.choices[0].finish_reason in ("stop", "length")


# ---- finding 11: messages OpenAI refuses ---------------------------------------------

@pytest.mark.parametrize("messages,says", [
    ([{"role": "wizard", "content": "hi"}], "messages[0].role"),
    ([{"role": "user"}], "messages[0].content"),
    ([{"role": "user", "content": None}], "messages[0].content"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user"}], "messages[1].content"),
    ([{"role": "assistant", "content": None}], "messages[0].content"),
    ([{"role": "tool", "tool_call_id": "c"}], "messages[0].content"),
    ([{"role": "function", "content": "r"}], "messages[0].name"),
], ids=["wizard", "no-content", "null-content", "second-message", "assistant-no-calls",
        "tool-no-content", "function-no-name"])
def test_unknown_roles_and_missing_content_are_400(http, messages, says):
    message = refused(http, "/v1/chat/completions", {"messages": messages, "max_tokens": 1},
                      "messages")
    assert says in message


def test_the_openai_client_gets_400_for_a_wizard(server):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)
    for messages in ([{"role": "wizard", "content": "hi"}], [{"role": "user"}]):
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="smollm2", messages=messages, max_tokens=1)
        assert e.value.param == "messages"


@pytest.mark.parametrize("messages", [
    [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [{"role": "user", "content": "Hi"},
     {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                           "function": {"name": "f", "arguments": "{}"}}]}],
], ids=["developer", "assistant-calls-without-content"])
def test_what_openai_accepts_still_passes(http, messages):
    r = http.post("/v1/chat/completions", json={"messages": messages, "max_tokens": 1})
    # SmolLM2's template cannot show tool calls: that 400 comes after validation.
    if any("tool_calls" in m for m in messages):
        assert r.status_code == 400 and "does not support tool calls" in r.text, r.text
    else:
        assert r.status_code == 200, r.text


def test_ollama_refuses_unknown_roles_and_defaults_missing_content(server, http):
    refused(http, "/api/chat", {"model": "smollm2", "stream": False,
                                "messages": [{"role": "wizard", "content": "hi"}]}, "role")
    client = ollama.Client(host=server.url, timeout=120)
    with pytest.raises(ollama.ResponseError) as e:
        client.chat(model="smollm2", messages=[{"role": "wizard", "content": "hi"}])
    assert e.value.status_code == 400 and "role" in e.value.error
    # Ollama reads a missing content as "": so does llmctl on /api/chat.
    r = http.post("/api/chat", json={"model": "smollm2", "stream": False,
                                     "messages": [{"role": "system", "content": "Be brief."},
                                                  {"role": "user"}],
                                     "options": {"num_predict": 1}})
    assert r.status_code == 200, r.text
    assert json.loads(r.text)["done"] is True
