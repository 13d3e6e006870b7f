"""Ollama's API (/api/*) against a real `llmctl serve smollm2`, through the
official `ollama` Python client and raw HTTP for the wire format."""

import json
from datetime import datetime

import httpx
import ollama
import pytest
from near_tie import assert_greedy_agree, top_from_openai

from llmctl import __version__
from llmctl.bench.launcher import Server
from llmctl.runtime.engine.events import FinishEvent, TokenEvent, Usage
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.server.answer_reader import AnswerReader, ToolSetup
from llmctl.server.generation import Answer
from llmctl.server.ollama.request import chat_messages
from llmctl.server.ollama.routes import _Timing, _Writer
from llmctl.store.resolve import UNKNOWN_MODEL

MSG = [{"role": "user", "content": "Name three colours."}]
GREEDY = {"temperature": 0, "seed": 7, "num_predict": 12}


@pytest.fixture(scope="module")
def srv(session_home):
    with Server.llmctl_serve("smollm2", "--ctx-size", "512", "--max-num-seqs", "2",
                             env={"LLMCTL_HOME": str(session_home)}) as server:
        yield server


@pytest.fixture(scope="module")
def client(srv):
    return ollama.Client(host=srv.url)


@pytest.fixture(scope="module")
def http(srv):
    # Shared machines can be slow; a hung server still fails the test.
    with httpx.Client(base_url=srv.url, timeout=120) as c:
        yield c


def _same_answers(http, exactness, texts: list[str]) -> None:
    """The answers of one greedy MSG request, sent at different times: the
    second is a prefix-cache hit, whose prompt tail is computed with
    another batch shape than the cold run's, which the server's defaults
    do not hold exact: each the same as a reference up to its first
    near-tie (tests/near_tie.py). Ollama's routes report no logprobs, so the
    reference is the same request through OpenAI's route."""
    measured = exactness(serve_default=True)
    body = {"model": "smollm2", "messages": MSG, "temperature": 0, "seed": GREEDY["seed"],
            "max_tokens": GREEDY["num_predict"], "logprobs": True, "top_logprobs": 5}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    content = r.json()["choices"][0]["logprobs"]["content"]
    ref = [c["token"] for c in content]
    for text in texts:
        assert_greedy_agree(measured, ref, text, top_from_openai(content))


def _ns_metrics(r) -> None:
    assert r.done is True and r.done_reason in ("stop", "length")
    assert r.prompt_eval_count > 0 and r.eval_count > 0
    for name in ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration"):
        assert isinstance(r[name], int), name
    # Nanoseconds: the whole request took longer than its parts.
    assert r.total_duration >= r.prompt_eval_duration > 0
    assert r.total_duration >= r.eval_duration


def test_chat_whole_and_streamed_agree(client, http, exactness):
    whole = client.chat(model="smollm2", messages=MSG, options=GREEDY, stream=False)
    assert whole.message.role == "assistant" and whole.message.content
    assert whole.model == "smollm2"
    datetime.fromisoformat(whole.created_at)
    _ns_metrics(whole)
    parts = list(client.chat(model="smollm2", messages=MSG, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    _same_answers(http, exactness, ["".join(p.message.content for p in parts), whole.message.content])
    assert parts[-1].eval_count == whole.eval_count and parts[-1].done_reason == whole.done_reason
    _ns_metrics(parts[-1])


def test_generate_whole_and_streamed_agree(client):
    whole = client.generate(model="smollm2", prompt="The sky is", options=GREEDY)
    assert whole.response and whole.done
    _ns_metrics(whole)
    streamed = list(client.generate(model="smollm2", prompt="The sky is", options=GREEDY,
                                    stream=True))
    assert "".join(p.response for p in streamed) == whole.response


def test_generate_raw_and_system(client):
    one = {"num_predict": 1}
    templated = client.generate(model="smollm2", prompt="The sky is", options=one)
    raw = client.generate(model="smollm2", prompt="The sky is", raw=True, options=one)
    system = client.generate(model="smollm2", prompt="The sky is", options=one,
                             system="You answer in French, briefly and politely.")
    # The chat template wraps the prompt in role markers and a default
    # system message; a system prompt of our own is longer than that one.
    assert raw.prompt_eval_count < templated.prompt_eval_count
    assert system.prompt_eval_count != templated.prompt_eval_count


def test_num_predict_is_honoured(client):
    r = client.generate(model="smollm2", prompt="Count from one to fifty:",
                        options={"num_predict": 3, "temperature": 0})
    assert r.eval_count == 3 and r.done_reason == "length"


def test_format_json_parses(client):
    r = client.chat(model="smollm2", format="json", options={"temperature": 0, "num_predict": 60},
                    messages=[{"role": "user", "content": "A cat's name and age as JSON."}])
    assert isinstance(json.loads(r.message.content), dict)


def test_format_schema_is_enforced(client):
    schema = {"type": "object", "properties": {"legs": {"type": "integer"}},
              "required": ["legs"], "additionalProperties": False}
    r = client.generate(model="smollm2", prompt="How many legs has a spider? JSON.",
                        format=schema, options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(r.response)["legs"], int)


def test_list_show_version(client, http):
    listed = {m.model: m for m in client.list().models}
    assert "smollm2" in listed
    m = listed["smollm2"]
    assert m.size > 0 and len(m.digest) == 64 and m.details.format == "gguf"
    assert m.details.family == "llama" and m.details.quantization_level == "Q4_1"
    assert m.details.parameter_size.endswith("M")
    shown = client.show("smollm2")
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] > 0
    assert "<|im_start|>" in shown.template and "completion" in shown.capabilities
    assert http.get("/api/version").json() == {"version": __version__}


def test_keep_alive_zero_unloads_and_ps_follows(client):
    client.generate(model="smollm2")                       # Ollama's "load" request
    running = client.ps().models
    assert [m.model for m in running] == ["smollm2"]
    assert running[0].size > 0 and running[0].context_length == 512
    assert running[0].expires_at is not None
    r = client.generate(model="smollm2", keep_alive=0)
    assert r.done and r.done_reason == "unload"
    assert client.ps().models == []
    # The next request loads it again; keep_alive 0 on it unloads it after.
    client.chat(model="smollm2:latest", messages=MSG, options=GREEDY, keep_alive=0)
    assert client.ps().models == []
    loaded = client.chat(model="smollm2", messages=[], keep_alive="5m")
    assert loaded.done_reason == "load" and loaded.message.content == ""
    assert [m.model for m in client.ps().models] == ["smollm2"]


def _error(call) -> ollama.ResponseError:
    with pytest.raises(ollama.ResponseError) as info:
        call()
    return info.value


def test_errors_name_the_field_in_ollamas_shape(client, http):
    e = _error(lambda: client.chat(model="no-such-model", messages=MSG))
    # Every unknown name gets the same words, so none reveals what exists.
    assert e.status_code == 404 and e.error == UNKNOWN_MODEL
    e = _error(lambda: client.generate(model="smollm2", prompt="hi", options={"mirostat": 2}))
    assert e.status_code == 400 and "mirostat" in e.error
    e = _error(lambda: client.generate(model="smollm2", prompt="hi", options={"num_gpu": 1}))
    assert e.status_code == 400 and "num_gpu" in e.error
    e = _error(lambda: client.chat(model="smollm2", messages=[
        {"role": "user", "content": "What is this?", "images": [b"\x89PNG fake"]}]))
    assert e.status_code == 400 and "images" in e.error
    e = _error(lambda: client.generate(model="smollm2", prompt="x", suffix="y"))
    assert e.status_code == 400 and "suffix" in e.error
    e = _error(lambda: client.generate(model="smollm2", prompt="x", think=True))
    assert e.status_code == 400 and "thinking" in e.error
    e = _error(lambda: client.generate(model="smollm2", prompt="x", options={"num_ctx": 1 << 20}))
    assert e.status_code == 400 and "num_ctx" in e.error
    r = http.post("/api/chat", json={"model": "smollm2", "messages": MSG,
                                                "options": {"temperature": "hot"}})
    assert r.status_code == 400 and set(r.json()) == {"error"} and "temperature" in r.json()["error"]
    r = http.post("/api/generate", content=b"{not json")
    assert r.status_code == 400 and set(r.json()) == {"error"}


def test_ndjson_framing(http, exactness):
    body = {"model": "smollm2", "messages": MSG, "options": GREEDY}     # stream: Ollama's default
    with http.stream("POST", "/api/chat", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("application/x-ndjson")
        raw = b"".join(r.iter_bytes())
    assert raw.endswith(b"\n")
    lines = [json.loads(line) for line in raw.decode().split("\n")[:-1]]
    assert len(lines) >= 2 and all(line["model"] == "smollm2" for line in lines)
    assert [line["done"] for line in lines] == [False] * (len(lines) - 1) + [True]
    assert all(set(line["message"]) == {"role", "content"} for line in lines)
    last = lines[-1]
    assert last["done_reason"] in ("stop", "length") and last["message"]["content"] == ""
    assert last["created_at"].endswith("Z")
    whole = http.post("/api/chat", json={**body, "stream": False}).json()
    _same_answers(http, exactness,
                  ["".join(line["message"]["content"] for line in lines), whole["message"]["content"]])
    assert whole["eval_count"] == last["eval_count"] and whole["done_reason"] == last["done_reason"]


def test_embed(client):
    r = client.embed(model="smollm2", input=["The cat sat on the mat.", "A kitten rests on a rug.",
                                              "Quarterly tax filing deadlines"])
    assert len(r.embeddings) == 3 and r.prompt_eval_count > 0
    dot = [sum(a * b for a, b in zip(r.embeddings[0], v, strict=False)) for v in r.embeddings[1:]]
    assert dot[0] > dot[1]          # normalised vectors: similar sentences score closer


CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'
WEATHER = ToolSetup(ToolFormat.HERMES, frozenset({"get_weather"}))


def _writer() -> _Writer:
    return _Writer(True, "m", AnswerReader(WEATHER), _Timing(0.0, 0.0))


def test_tool_calls_have_object_arguments_streamed_and_whole():
    finish = FinishEvent("stop", Usage(10, 20), ttft_s=0.1, duration_s=0.3, decode_s=0.2)
    writer = _writer()
    text = ""
    for piece in (CALL[:9], CALL[9:30], CALL[30:]):
        out, ended = writer.lines([TokenEvent(piece, 0)])
        text += out
        assert not ended
    out, ended = writer.lines([finish])
    assert ended
    lines = [json.loads(line) for line in (text + out).splitlines()]
    calls = [c for line in lines for c in line["message"].get("tool_calls", [])]
    assert [c["function"] for c in calls] == \
        [{"index": 0, "name": "get_weather", "arguments": {"city": "Paris"}}]
    assert lines[-1]["done"] and lines[-1]["done_reason"] == "stop"
    assert lines[-1]["eval_duration"] == 200_000_000 and lines[-1]["prompt_eval_count"] == 10
    whole = _writer().whole(Answer(CALL, finish, [], (CALL,)))
    assert whole["message"]["content"] == ""
    assert [c["function"] for c in whole["message"]["tool_calls"]] == [c["function"] for c in calls]


def test_ollama_tool_history_becomes_openai_messages():
    messages = chat_messages([
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "content": "", "thinking": "two calls", "tool_calls": [
            {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"function": {"name": "get_time", "arguments": {}}}]},
        {"role": "tool", "content": "noon", "tool_name": "get_time"},
        {"role": "TOOL", "content": "11 degrees", "tool_name": "get_weather"},
    ])
    ids = [c["id"] for c in messages[1]["tool_calls"]]
    assert len(set(ids)) == 2 and "thinking" not in messages[1]
    assert (messages[2]["tool_call_id"], messages[2]["name"]) == (ids[1], "get_time")
    assert (messages[3]["role"], messages[3]["tool_call_id"]) == ("tool", ids[0])
