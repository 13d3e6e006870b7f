"""OpenAI's Responses API (/v1/responses) through the official openai
client's responses.create and responses.stream, and raw HTTP for what the
client hides, against a real `llmctl serve qwen2.5-coder-0.5b`; the store
and its sealed reasoning are tested without a model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from conftest import ServerProcess
from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.responses.request import parse_request
from llmctl.server.responses.store import ResponseStore, StoredResponse

MODEL = "qwen2.5-coder-0.5b"
WEATHER = {"type": "function", "name": "get_weather", "description": "Current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"], "additionalProperties": False},
           "strict": True}
# Codex's captured first request (fixtures/agent-requests/README.md).
FIXTURE = Path(__file__).resolve().parent / "fixtures/agent-requests/codex-0.169.0-responses.json"
# Codex 0.171's second request: its goal comes back as an output without a call_id.
GOAL = FIXTURE.with_name("codex-0.171.0-goal-output.json")


def _serve(home: Path, ctx: int = 2048):
    return ServerProcess([MODEL, "--ctx-size", str(ctx), "--max-num-seqs", "2",
                          "--max-num-batched-tokens", "256"],
                         env={"LLMCTL_HOME": str(home)}).wait_ready(600)


@pytest.fixture(scope="module")
def server(session_home):
    srv = _serve(session_home)
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0)


def ask(client, input, **kw):
    return client.responses.create(model=MODEL, input=input,
                                   **{"temperature": 0, "max_output_tokens": 32, **kw})


# ---- the store, without a model ------------------------------------------------------

def _record(rid: str, text: str = "x") -> StoredResponse:
    return StoredResponse({"id": rid, "object": "response"}, [],
                          [{"role": "user", "content": text}])


def test_store_bounds_survive_a_restart_and_refuse_paths(tmp_path):
    store = ResponseStore(tmp_path, max_count=2, max_bytes=1 << 20)
    for rid in ("resp_a1", "resp_b2", "resp_c3"):
        store.put(_record(rid))
        assert store.get(rid) is not None           # readable before it is on disk
    store.delete("resp_c3")                          # queued behind the writes
    again = ResponseStore(tmp_path, max_count=2, max_bytes=1 << 20)
    assert again.get("resp_a1") is None              # the oldest went past the count
    assert again.get("resp_b2").messages == [{"role": "user", "content": "x"}]
    assert again.get("resp_c3") is None and not again.delete("resp_c3")
    assert again.get("../secret") is None and not again.delete("resp_../x")


def test_sealed_reasoning_reads_back_only_from_its_home(tmp_path):
    store = ResponseStore(tmp_path / "a", 10, 1 << 20)
    sealed = store.seal("I think, therefore.")
    assert store.unseal(sealed, "input[0].encrypted_content") == "I think, therefore."
    other = ResponseStore(tmp_path / "b", 10, 1 << 20)
    tampered = sealed[:-1] + ("1" if sealed.endswith("0") else "0")
    with pytest.raises(InvalidParams):
        store.unseal(tampered, "input[0].encrypted_content")
    for bad in (sealed, "garbage", "llmctl1.\u00e9.\u00e9"):
        with pytest.raises(InvalidParams, match="encrypted_content"):
            other.unseal(bad, "input[0].encrypted_content")


def test_codex_request_translates(tmp_path):
    body = json.loads(FIXTURE.read_text())
    req = parse_request(body, True, SamplingParams(), store=ResponseStore(tmp_path, 10, 1 << 20))
    assert [m["role"] for m in req.messages] == ["developer", "developer", "user", "user"]
    assert req.tools.hosted == ("web_search",) and req.sealed and not req.store
    names = [t["function"]["name"] for t in req.structured.tools]
    assert "exec_command" in names and "multi_agent_v1__close_agent" in names
    assert req.tools.namespaces["multi_agent_v1__close_agent"] == ("multi_agent_v1", "close_agent")
    assert req.ignored == ("reasoning.summary",)


def test_an_output_without_a_call_answers_a_call_of_its_own(tmp_path):
    body = json.loads(GOAL.read_text())
    req = parse_request(body, True, SamplingParams(), store=ResponseStore(tmp_path, 10, 1 << 20))
    roles = [m["role"] for m in req.messages]
    assert roles[4:] == ["assistant", "tool", "assistant", "tool"]
    call = req.messages[6]["tool_calls"][0]
    assert call["function"] == {"name": "agent__goal_objective", "arguments": "{}"}
    assert req.messages[7]["tool_call_id"] == call["id"] != req.messages[5]["tool_call_id"]
    assert req.messages[7]["content"] == body["input"][6]["output"]
    orphan = {"type": "function_call_output", "output": "x"}       # neither call_id nor name
    with pytest.raises(InvalidParams, match=r"input\[0\]\.call_id"):
        parse_request({"model": MODEL, "input": [orphan]}, False, SamplingParams(),
                      store=ResponseStore(tmp_path, 10, 1 << 20))


# ---- against the model ----------------------------------------------------------------


@pytest.mark.slow
def test_text_then_stream_events_in_order(client):
    r = ask(client, "Say hello.", instructions="You are terse.")
    assert r.id.startswith("resp_") and r.object == "response" and r.status == "completed"
    assert r.output_text.strip() and r.output[0].type == "message"
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0
    assert r.usage.input_tokens_details.cached_tokens >= 0
    with client.responses.stream(model=MODEL, input="Say hello.", temperature=0,
                                 max_output_tokens=16) as stream:
        events = list(stream)
    final = events[-1].response      # get_final_response() wants a completed one
    kinds = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = [i for i, k in enumerate(kinds) if k == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert deltas and deltas == list(range(4, 4 + len(deltas)))
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done",
                                       f"response.{final.status}"]
    assert "".join(events[i].delta for i in deltas) == final.output_text


@pytest.mark.slow
def test_named_function_streamed_then_its_output_round_trip(client):
    with client.responses.stream(model=MODEL, input="What's the weather in Paris?",
                                 tools=[WEATHER], temperature=0, max_output_tokens=64,
                                 tool_choice={"type": "function", "name": "get_weather"}) as s:
        events = list(s)
    final = events[-1].response
    assert events[-1].type == "response.completed"
    [call] = [o for o in final.output if o.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER["parameters"])
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert "".join(pieces) == done[0].arguments == call.arguments
    history = [{"role": "user", "content": "What's the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": '{"temp_c": 21, "sky": "clear"}'}]
    answer = ask(client, history, tools=[WEATHER], tool_choice="none", max_output_tokens=40)
    assert answer.status in ("completed", "incomplete") and answer.output_text.strip()


@pytest.mark.slow
def test_json_schema_output_validates(client):
    schema = {"type": "object", "properties": {"city": {"type": "string"},
                                               "population": {"type": "integer"}},
              "required": ["city", "population"], "additionalProperties": False}
    r = ask(client, "Give the capital of France and its population as JSON.",
            max_output_tokens=60,
            text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                             "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


@pytest.mark.slow
def test_namespace_and_hosted_tools_and_counts(server):
    body = {"model": MODEL, "input": "Close the agent named worker-1.", "temperature": 0,
            "max_output_tokens": 48,
            "tools": [{"type": "web_search"},
                      {"type": "namespace", "name": "multi_agent_v1", "description": "Agents",
                       "tools": [{"type": "function", "name": "close_agent",
                                  "parameters": {"type": "object",
                                                 "properties": {"target": {"type": "string"}},
                                                 "required": ["target"]}}]}],
            "tool_choice": {"type": "function", "name": "close_agent",
                            "namespace": "multi_agent_v1"}}
    r = httpx.post(server.url + "/v1/responses", json=body, timeout=120)
    assert r.status_code == 200 and r.headers["x-llmctl-ignored"] == "tools.web_search"
    [call] = r.json()["output"]
    assert (call["type"], call["name"], call["namespace"]) == \
        ("function_call", "close_agent", "multi_agent_v1")
    assert "target" in json.loads(call["arguments"])
    count = httpx.post(server.url + "/v1/responses/input_tokens", json=body, timeout=60).json()
    assert count["object"] == "response.input_tokens" and count["input_tokens"] > 10
    [model] = httpx.get(server.url + "/v1/models").json()["data"]
    assert model["context_length"] == model["max_model_len"] == 2048


@pytest.mark.slow
def test_error_shape(client, server):
    def post(body):
        return httpx.post(server.url + "/v1/responses", json={"model": MODEL, **body}, timeout=60)

    for body, param in [({"input": "hi", "background": True}, "background"),
                        ({"input": "hi", "conversation": "conv_1"}, "conversation"),
                        ({"input": "hi", "frobnicate": 1}, "frobnicate"),
                        ({"input": [{"type": "reasoning", "id": "rs_1", "summary": [],
                                     "encrypted_content": "forged"}]}, "input"),
                        ({"input": "hi", "previous_response_id": "resp_nope"},
                         "previous_response_id")]:
        r = post(body)
        assert r.status_code == 400, body
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param
        assert error["message"]
    overflow = post({"input": "hello " * 2500, "max_output_tokens": 16})
    assert overflow.status_code == 400
    assert "tokens" in overflow.json()["error"]["message"]
    assert overflow.json()["error"]["code"] == "context_length_exceeded"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_doesnotexist")
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(model=MODEL, input="hi", tool_choice="required")
    assert e.value.body["param"] == "tool_choice"


@pytest.mark.slow
def test_previous_response_id_remembers_after_restart(session_home, server, client):
    first = ask(client, "My name is Zorblat. Just reply OK.", max_output_tokens=8)
    second = ask(client, "What is my name? Answer with the name only.",
                 previous_response_id=first.id, max_output_tokens=12)
    assert "Zorblat" in second.output_text
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    items = client.responses.input_items.list(first.id)
    assert [i.type for i in items.data] == ["message"]
    server.stop()
    again = _serve(session_home)
    try:
        fresh = openai.OpenAI(base_url=again.url + "/v1", api_key="x", max_retries=0)
        third = ask(fresh, "What is my name? Answer with the name only.",
                    previous_response_id=first.id, max_output_tokens=12)
        assert "Zorblat" in third.output_text
        fresh.responses.delete(first.id)
        with pytest.raises(openai.NotFoundError):
            fresh.responses.retrieve(first.id)
    finally:
        again.stop()


@pytest.mark.slow
def test_codex_first_turn(session_home):
    body = json.loads(FIXTURE.read_text())
    # The capture names the model as Codex was configured; the rest is as sent.
    body.update(model=MODEL, max_output_tokens=24, temperature=0)
    srv = ServerProcess([MODEL, "--ctx-size", "8192", "--max-num-seqs", "1"],
                        env={"LLMCTL_HOME": str(session_home)}).wait_ready(600)
    try:
        with httpx.stream("POST", srv.url + "/v1/responses", json=body, timeout=600,
                          headers={"accept": "text/event-stream"}) as r:
            assert r.status_code == 200, r.read()
            # Codex asks for a reasoning summary too, which nothing here writes.
            assert r.headers["x-llmctl-ignored"].split(", ") == ["tools.web_search",
                                                                  "reasoning.summary"]
            events = [json.loads(line[6:]) for line in r.iter_lines()
                      if line.startswith("data: ")]
    finally:
        srv.stop()
    assert events[0]["type"] == "response.created"
    assert events[-1]["type"] in ("response.completed", "response.incomplete")
    final = events[-1]["response"]
    assert final["store"] is False and final["usage"]["input_tokens"] > 4000
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
