"""Anthropic's Messages API (/v1/messages) through the official `anthropic`
client and raw HTTP against a real `llmctl serve qwen2.5-coder-0.5b`, and
its request translation and event writer without a model."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from conftest import ServerProcess, qwen_server
from llmctl.errors import InvalidParams, QueueFull
from llmctl.runtime.engine.events import ErrorEvent
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.answer_reader import AnswerReader
from llmctl.server.anthropic.frames import MessageWriter
from llmctl.server.anthropic.request import parse_messages
from llmctl.server.middleware import guard
from llmctl.server.state import HttpPolicy

MODEL = "qwen2.5-coder-0.5b"
# Claude Code's captured first request (fixtures/agent-requests/README.md).
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "agent-requests"
CLAUDE_CODE = FIXTURES / "claude-code-2.1.328-messages.json"
CLAUDE_HEADERS = {
    "anthropic-version": "2023-06-01",
    "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14,"
                      "context-management-2025-06-27,mid-conversation-tool-changes-2026-07-01,"
                      "advanced-tool-use-2025-11-20,effort-2025-11-24"}
WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {
               "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
               "required": ["city"]}}
TIME = {"name": "get_time", "description": "Local time in a city",
        "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                         "required": ["city"]}}
PARIS = [{"role": "user", "content": "What's the weather in Paris?"}]
# The current SDK has no temperature argument; older clients send it.
GREEDY = {"temperature": 0}
RAW_EVENTS = ("message_start", "content_block_start", "content_block_delta",
              "content_block_stop", "message_delta", "message_stop")


@pytest.fixture(scope="module")
def server(session_home):
    with qwen_server(session_home) as url:
        yield url


@pytest.fixture(scope="module")
def client(server):
    return anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)


def create(client, messages=None, **kw):
    kw = {"model": MODEL, "max_tokens": 32, "extra_body": GREEDY, **kw}
    return client.messages.create(messages=messages or PARIS, **kw)


def test_text_message(client):
    m = create(client, [{"role": "user", "content": "Say hello in one word."}],
               system="You are terse.")
    assert m.id.startswith("msg_") and m.type == "message" and m.role == "assistant"
    assert m.model == MODEL and m.content[0].type == "text" and m.content[0].text.strip()
    assert m.stop_reason in ("end_turn", "max_tokens") and m.stop_sequence is None
    assert m.usage.input_tokens > 0 and m.usage.output_tokens > 0


def test_stream_events_in_order(client):
    with client.messages.stream(model=MODEL, max_tokens=24, extra_body=GREEDY,
                                messages=[{"role": "user", "content": "Count to five."}]) as s:
        # The SDK adds its own "text" events beside the server's.
        events = [e for e in s if e.type in RAW_EVENTS]
        final = s.get_final_message()
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = kinds[1:-2]
    # Each block: start, its deltas, stop; the indexes count up from 0.
    assert blocks and blocks[0] == "content_block_start" and blocks[-1] == "content_block_stop"
    starts = [e for e in events if e.type == "content_block_start"]
    assert [e.index for e in starts] == list(range(len(starts)))
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text and final.content[0].text == text
    assert events[-2].delta.stop_reason == final.stop_reason
    assert events[-2].usage.output_tokens == final.usage.output_tokens > 0


def test_named_tool_calls_exactly_that_tool(client):
    m = create(client, tools=[WEATHER, TIME], tool_choice={"type": "tool", "name": "get_time"},
               max_tokens=64)
    calls = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and calls and {c.name for c in calls} == {"get_time"}
    assert calls[0].id.startswith("toolu_")
    jsonschema.validate(calls[0].input, TIME["input_schema"])


def test_any_calls_a_tool_then_tool_result_round_trip(client):
    m = create(client, tools=[WEATHER], tool_choice={"type": "any",
                                                     "disable_parallel_tool_use": True},
               max_tokens=64)
    calls = [b for b in m.content if b.type == "tool_use"]
    assert m.stop_reason == "tool_use" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, WEATHER["input_schema"])
    history = PARIS + [
        {"role": "assistant", "content": [c.model_dump() for c in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id,
                                      "content": [{"type": "text",
                                                   "text": '{"temp_c": 21, "sky": "clear"}'}]}]}]
    final = create(client, history, tools=[WEATHER], tool_choice={"type": "none"},
                   max_tokens=48)
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert final.content and final.content[0].type == "text" and final.content[0].text.strip()


def test_streamed_input_json_joins_to_the_final_input(client):
    with client.messages.stream(model=MODEL, max_tokens=64, extra_body=GREEDY, messages=PARIS,
                                tools=[WEATHER], tool_choice={"type": "tool",
                                                              "name": "get_weather"}) as s:
        events = [e for e in s if e.type in RAW_EVENTS]
        final = s.get_final_message()
    parts = [e.delta.partial_json for e in events
             if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
    starts = [e.content_block for e in events if e.type == "content_block_start"]
    assert starts[0].type == "tool_use" and starts[0].name == "get_weather"
    assert parts and json.loads("".join(parts)) == final.content[0].input
    jsonschema.validate(final.content[0].input, WEATHER["input_schema"])
    assert final.stop_reason == "tool_use"


def test_stop_sequences(client):
    m = create(client, [{"role": "user", "content": "Count from 1 to 10, separated by commas."}],
               stop_sequences=["5"])
    text = m.content[0].text
    assert "4" in text and "5" not in text
    assert (m.stop_reason, m.stop_sequence) == ("stop_sequence", "5")


def test_output_config_format(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "country": {"type": "string"}},
              "required": ["city", "country"], "additionalProperties": False}
    m = create(client, [{"role": "user", "content": "Name a city in France as JSON."}],
               output_config={"format": {"type": "json_schema", "schema": schema}},
               max_tokens=48)
    jsonschema.validate(json.loads(m.content[0].text), schema)


def test_count_tokens_matches_the_prompt(client):
    kw = {"model": MODEL, "system": "Count these tokens.", "tools": [WEATHER],
          "messages": [{"role": "user", "content": "How many tokens is this?"}]}
    counted = client.messages.count_tokens(**kw).input_tokens
    m = client.messages.create(max_tokens=1, **kw)
    assert counted > 0 and counted == m.usage.input_tokens + m.usage.cache_read_input_tokens


@pytest.mark.slow
def test_cache_read_on_a_repeated_long_system_prompt(client):
    system = [{"type": "text", "text": "You answer questions about the weather. " * 60,
               "cache_control": {"type": "ephemeral"}}]
    first = create(client, system=system, max_tokens=4)
    second = create(client, [{"role": "user", "content": "And in Rome?"}], system=system,
                    max_tokens=4)
    assert first.usage.input_tokens > 400
    assert second.usage.cache_read_input_tokens > 400
    assert second.usage.cache_creation_input_tokens == 0


@pytest.mark.slow
def test_max_tokens_is_capped_to_the_room_left(server, client):
    def body(k):
        return {"model": MODEL, "messages": [{"role": "user",
                                              "content": "lorem ipsum dolor sit amet " * k}]}

    def count(k):
        return client.messages.count_tokens(**body(k)).input_tokens

    # A prompt that leaves 8 or so of the 2048 tokens: Claude Code's 32000 is capped to them.
    per = (count(200) - count(100)) / 100
    k = int((2048 - 8 - (count(100) - 100 * per)) / per)
    room = 2048 - count(k)
    assert 0 < room <= 16, room
    # The SDK streams a request for that many tokens, as Claude Code does.
    with client.messages.stream(max_tokens=32000, extra_body=GREEDY, **body(k)) as s:
        m = s.get_final_message()
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == room
    # Past the context, the error says how large the context is.
    big = {**body(2 * k), "max_tokens": 10}
    assert "2048" in _error(server, big, 400, "invalid_request_error")


def _error(server, body, status, etype, path="/v1/messages", headers=None):
    r = httpx.post(server + path, json=body, headers=headers, timeout=60)
    assert r.status_code == status, r.text
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == etype, r.text
    return r.json()["error"]["message"]


def test_error_shape(server, client):
    base = {"model": MODEL, "max_tokens": 8, "messages": PARIS}
    assert "max_tokens" in _error(server, {**base, "max_tokens": None}, 400,
                                  "invalid_request_error")
    _error(server, {**base, "model": "no-such-model"}, 404, "not_found_error")
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAAA"}}
    assert "image" in _error(server, {**base, "messages": [{"role": "user", "content": [
        image]}]}, 400, "invalid_request_error")
    assert "web_search" in _error(server, {**base, "tools": [
        {"type": "web_search_20250305", "name": "web_search"}]}, 400, "invalid_request_error")
    assert "get_time" in _error(server, {**base, "tools": [WEATHER], "tool_choice": {
        "type": "tool", "name": "get_time"}}, 400, "invalid_request_error")
    _error(server, base, 404, "not_found_error", path="/v1/messages/nope")
    with pytest.raises(anthropic.BadRequestError) as e:
        client.messages.create(model=MODEL, max_tokens=0, messages=PARIS)
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_query_and_headers_are_accepted(server):
    r = httpx.post(server + "/v1/messages?beta=true", headers=CLAUDE_HEADERS, timeout=60,
                   json={"model": MODEL, "max_tokens": 4, "messages": PARIS,
                         "metadata": {"user_id": "u"}, "new_field": 1})
    assert r.status_code == 200 and r.json()["type"] == "message"
    assert r.headers["x-llmctl-ignored"] == "new_field"


# ---- without a model -------------------------------------------------------------


def test_claude_codes_body_translates():
    body = json.loads(CLAUDE_CODE.read_text())
    req = parse_messages(body, False, SamplingParams())
    roles = [m["role"] for m in req.messages]
    assert roles == ["system", "user", "system"]
    assert len(req.structured.tools) == 21 and req.structured.choice.mode == "auto"
    assert req.thinking and req.stream and req.params.max_tokens == 32000
    assert req.ignored == ["output_config.effort"]


def test_thinking_history_and_context_management():
    turn = {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm",
                                              "signature": "s"},
                                             {"type": "text", "text": "ok"}]}
    messages = [{"role": "user", "content": "a"}, turn, {"role": "user", "content": "b"},
                copy.deepcopy(turn), {"role": "user", "content": "c"}]
    keep_one = {"edits": [{"type": "clear_thinking_20251015",
                           "keep": {"type": "thinking_turns", "value": 1}},
                          {"type": "clear_tool_uses_20250919"}]}
    req = parse_messages({"model": MODEL, "max_tokens": 8, "messages": messages,
                          "context_management": keep_one}, False, SamplingParams())
    kept = [m.get("reasoning_content") for m in req.messages if m["role"] == "assistant"]
    assert kept == [None, "hmm"]
    assert req.ignored == ["context_management.edits[1].type=clear_tool_uses_20250919"]


@pytest.mark.parametrize("body, param", [
    ({"messages": PARIS}, "max_tokens"),
    ({"max_tokens": 8, "messages": PARIS, "container": "c"}, "container"),
    ({"max_tokens": 8, "messages": PARIS, "tool_choice": {"type": "maybe"}}, "tool_choice"),
    ({"max_tokens": 8, "messages": PARIS, "stop_sequences": "x"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": PARIS, "thinking": {"type": "enabled"}}, "thinking"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "document", "source": {}}]}]}, "messages"),
    ({"max_tokens": 8, "messages": PARIS + [{"role": "assistant", "content": "It is"}]},
     "messages"),
])
def test_refused_by_name(body, param):
    with pytest.raises(InvalidParams) as e:
        parse_messages({"model": MODEL, **body}, False, SamplingParams())
    assert e.value.param == param


def test_error_mid_stream_is_an_error_event():
    writer = MessageWriter(MODEL, AnswerReader(None), False, 3)
    assert writer.opening().startswith("event: message_start\n")
    out, ended = writer.frames([(0, ErrorEvent(QueueFull("the queue is full")))])
    assert ended and out.startswith("event: error\n")
    assert json.loads(out.split("data: ", 1)[1]) == {
        "type": "error", "error": {"type": "overloaded_error", "message": "the queue is full"}}


@pytest.mark.slow
def test_claude_codes_first_request(session_home):
    """Claude Code's captured first turn (about 11,600 prompt tokens), sent as
    it sends it, with pings while the long prompt prefills."""
    body = json.loads(CLAUDE_CODE.read_text())
    body |= {"model": MODEL, "max_tokens": 16}
    srv = ServerProcess([MODEL, "--ctx-size", "16384", "--max-num-seqs", "1"],
                        env={"LLMCTL_HOME": str(session_home), "LLMCTL_SSE_KEEPALIVE_S": "1"})
    try:
        url = srv.wait_ready(600).url
        with httpx.stream("POST", url + "/v1/messages?beta=true", json=body,
                          headers=CLAUDE_HEADERS, timeout=900) as r:
            assert r.status_code == 200, r.read()
            assert r.headers["x-llmctl-ignored"] == "output_config.effort"
            lines = [line for line in r.iter_lines() if line.startswith("event: ")]
    finally:
        srv.stop()
    kinds = [line[7:] for line in lines]
    assert kinds[0] == "message_start" and "ping" in kinds
    kinds = [k for k in kinds if k != "ping"]
    assert kinds[-2:] == ["message_delta", "message_stop"] and "content_block_start" in kinds


def test_api_key_from_x_api_key_or_bearer():
    async def ok(request):
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route(p, ok, methods=["POST"])
                            for p in ("/v1/messages", "/v1/chat/completions")])
    http = TestClient(guard(app, HttpPolicy(api_key="k")))
    assert http.post("/v1/messages", headers={"x-api-key": "k"}).status_code == 200
    assert http.post("/v1/messages", headers={"authorization": "Bearer k"}).status_code == 200
    r = http.post("/v1/messages", headers={"x-api-key": "wrong"})
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert r.json()["type"] == "error"
    r = http.post("/v1/chat/completions")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
