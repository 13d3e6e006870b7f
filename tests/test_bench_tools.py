"""scripts/bench_tools.py's judging of answers, on hand-made responses in
the openai client's own types (no server is started)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from openai.types.chat import ChatCompletion

from conftest import script_module


@pytest.fixture(scope="module")
def bench():
    with script_module("bench_tools") as module:
        yield module


def completion(content=None, calls=(), finish="stop") -> ChatCompletion:
    message = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = [
            {"id": f"call_{i}", "type": "function", "function": {"name": n, "arguments": a}}
            for i, (n, a) in enumerate(calls)]
    return ChatCompletion.model_validate({
        "id": "x", "object": "chat.completion", "created": 0, "model": "m",
        "choices": [{"index": 0, "finish_reason": finish, "message": message}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2, "total_tokens": 3}})


WEATHER = ("get_weather", '{"city": "Paris", "unit": "celsius"}')


@pytest.mark.parametrize("choice", ["auto", "required", "get_weather"])
def test_a_call_that_validates_is_valid(bench, choice):
    resp = completion(calls=[WEATHER, ("send_email", '{"to": ["a@b.c"], "subject": "s", '
                                                     '"body": "b"}')], finish="tool_calls")
    expected = "call to 'send_email'" if choice == "get_weather" else None
    assert bench.tool_call_problem(resp, choice) == expected


@pytest.mark.parametrize("resp, problem", [
    (completion("It is sunny."), "finish_reason 'stop'"),
    (completion(calls=[WEATHER], finish="stop"), "finish_reason 'stop'"),
    (completion(finish="tool_calls"), "without tool_calls"),
    (completion(calls=[("rm_rf", "{}")], finish="tool_calls"), "call to 'rm_rf'"),
    (completion(calls=[("get_weather", '{"city": ')], finish="tool_calls"), "not JSON"),
    (completion(calls=[("get_weather", '{"unit": "celsius"}')], finish="tool_calls"),
     "'city' is a required property"),
    (completion(calls=[("get_weather", '{"city": "P", "unit": "kelvin"}')], finish="tool_calls"),
     "'kelvin' is not one of"),
    (completion(calls=[("create_event", '{"title": "t", "start": {"time": "12:00"}}')],
                finish="tool_calls"), "'date' is a required property"),
])
def test_invalid_calls_say_why(bench, resp, problem):
    assert problem in bench.tool_call_problem(resp, "required")


def test_schema_answers(bench):
    schema = bench.SCHEMA_CASES[0][1]
    good = {"name": "Ana", "age": 30, "email": "ana@example.com"}
    assert bench.schema_problem(completion(json.dumps(good)), schema) is None
    assert "not JSON (length)" in bench.schema_problem(completion('{"name": ', finish="length"),
                                                       schema)
    assert "not JSON" in bench.schema_problem(completion(None), schema)
    assert "Additional properties" in bench.schema_problem(
        completion(json.dumps({**good, "x": 1})), schema)


def test_every_schema_and_tool_is_a_valid_json_schema(bench):
    for _, schema in bench.SCHEMA_CASES:
        jsonschema.Draft202012Validator.check_schema(schema)
    for tool in bench.TOOLS.values():
        jsonschema.Draft202012Validator.check_schema(tool["function"]["parameters"])
    assert {c for _, c in bench.TOOL_CASES} - {"auto", "required"} <= set(bench.TOOLS)


def test_cases_shape_each_request(bench):
    work = bench.cases("m", limit=10)
    assert [c.kind for c in work].count("schema") == len(bench.SCHEMA_CASES)
    named = [c for c in work if c.kind == "tools:named"]
    assert named and all(c.kwargs["tool_choice"]["function"]["name"] in bench.TOOLS for c in named)
    assert len({c.kwargs["seed"] for c in work}) == len(work)
    assert all(c.kwargs["temperature"] == 0 for c in work)
    assert len(bench.cases("m", limit=2)) == 4


def test_summarize_counts_every_pass_and_takes_median_rates(bench):
    def run(rate1, rate4, ok):
        reqs = [{"kind": "schema", "valid": ok, "tokens": 5, "problem": None if ok else "bad"}]
        return {"c1": {"tok_s": rate1, "requests": reqs}, "c4": {"tok_s": rate4, "requests": reqs}}

    out = bench.summarize([run(10, 30, True), run(20, 10, False), run(30, 20, True)])
    assert out["valid"] == {"schema": {"valid": 4, "total": 6, "share": 4 / 6}}
    assert out["tok_s"] == {"c1": 20, "c4": 20}
    assert out["problems"] == {"schema: bad": 2}
