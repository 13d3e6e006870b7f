"""tool_choice "auto" on a Hermes model that answers with a bare or fenced
call object instead of a <tool_call> block: a bare call is a call only as the
whole answer (after a tool's result the model echoes its call, then answers),
an anchored lazy trigger starts the tool-call grammar there (so the name is
an offered tool and the arguments follow its schema), and any other answer,
JSON included, stays content byte for byte. The parser and the pattern are
tested without a model, the grammar and trigger on llama.cpp's grammar
engine, and the whole path through the openai client against a real
`llmctl serve qwen2.5-coder-0.5b`."""

from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from conftest import qwen_server
from llmctl.errors import LlmctlError
from llmctl.runtime.formats.grammar import tool_call_grammar
from llmctl.runtime.formats.tool_calls import TextDelta, ToolCallParser, ToolFormat, collect
from llmctl.runtime.formats.tool_schema import validate_tools
from llmctl.runtime.formats.tool_shapes import CALL_OPENING, CALL_OPENING_MAX
from llmctl.runtime.llama.grammar_budget import GrammarBudget
from llmctl.runtime.llama.grammar_sampler import ANCHOR_WINDOW, Grammar
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.tool_protocol import parse_structured

H = ToolFormat.HERMES
NAMES = {"get_weather", "get_time"}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
CALL = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
PRETTY = '{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}'


def parsed(text: str, names: set[str] | None = None, chunk: int = 0):
    """The message `text` parses into, whole (chunk 0) or fed `chunk` characters at a time."""
    stream = ToolCallParser(H, NAMES if names is None else names)
    pieces = [text[i:i + chunk] for i in range(0, len(text), chunk)] if chunk else [text]
    return collect([d for p in pieces for d in stream.feed(p)] + stream.finish())


@pytest.mark.parametrize("text, n", [
    (CALL, 1), ("\n  " + CALL + "\n", 1), ('{ "name" : "get_weather", "arguments": {"city": "Paris"}}', 1),
    (PRETTY, 1), (f"```\n{PRETTY}\n```", 1), (f"```json\n{CALL}\n```", 1), (CALL + " \n\t", 1),
])
def test_a_bare_or_fenced_call_opening_the_answer_is_a_call(text, n):
    for chunk in (0, 1, 5):
        msg = parsed(text, chunk=chunk)
        assert msg.content is None
        assert [(c.name, json.loads(c.arguments)) for c in msg.tool_calls] == \
            [("get_weather", {"city": "Paris"})] * n


@pytest.mark.parametrize("text", [
    '{"city": "Paris"}', "[1, 2]", '{"names": ["a", "b"]}', '{"name": "Bob", "age": 3}',
    '{"name": "hello.txt", "arguments": {"file_path": "hello.txt", "content": "hi"}}',
    '{"name": "get_weather", "arguments": [1]}', '{"name": "get_weather", "arguments": {"city": "Par',
    '{"name"}', f"Sure: {CALL}", f"The call is\n{CALL}", '```json\n{"city": "Paris"}\n```',
    f"```python\n{CALL}\n```", "Paris is sunny today.",
    # A bare call is a call only as the whole answer: anything after it makes all of it content.
    f"{CALL} and then some prose", f"{CALL}\nThe weather in Paris is sunny.", f"{CALL}\n{CALL}",
    f"{PRETTY}\n\nIt is 18 C in Paris.", f"{CALL}\n```json\n{CALL}\n```", f"{CALL}.",
])
def test_anything_else_stays_content_byte_for_byte(text):
    for chunk in (0, 1, 3):
        msg = parsed(text, chunk=chunk)
        assert msg.content == text and not msg.tool_calls and msg.reasoning is None


def test_a_bare_call_is_held_until_the_answer_ends():
    stream = ToolCallParser(H, NAMES)
    assert stream.feed(CALL) == [] and stream.feed("\n ") == []
    (head, args, done) = stream.finish()
    assert (head.name, args.arguments, done.index) == ("get_weather", '{"city":"Paris"}', 0)
    stream = ToolCallParser(H, NAMES)
    assert stream.feed(CALL + "\n") == []
    first = stream.feed("It is")
    assert first == [TextDelta(CALL + "\nIt is")]   # decided: content at once
    assert collect(first + stream.feed(" sunny.") + stream.finish()).content == CALL + "\nIt is sunny."


def test_after_an_echoed_call_a_tagged_call_is_still_a_call():
    msg = parsed(f"{CALL}\n<tool_call>\n{CALL}\n</tool_call>")
    assert msg.content == CALL and [c.name for c in msg.tool_calls] == ["get_weather"]


def test_json_content_streams_without_waiting_for_its_end():
    stream = ToolCallParser(H, NAMES)
    assert stream.feed('{"ci') == [TextDelta('{"ci')]
    stream = ToolCallParser(H, NAMES)
    assert stream.feed('{ "nam') == []          # may still open a call: held until decided
    assert stream.feed('es": 1') == [TextDelta('{ "names": 1')]


def test_no_tool_allowed_keeps_a_call_object_as_content():
    assert parsed(CALL, names=set()).content == CALL


def test_the_opening_pattern_is_anchored_and_bounded():
    pattern = re.compile(CALL_OPENING)
    for text, at in [('{"name"', 0), ('  { "name": "x', 2), ('\n{\n  "name"', 1),
                     ('```json\n{"name"', 0), ('``` \n\n  {"name"', 0), ('```\r\n{  "name"', 0)]:
        m = pattern.match(text)
        assert m is not None and m.start(1) == at, text
    for text in ('Sure {"name"', '{"names"', '[{"name"', '```python\n{"name"', '{"city"',
                 'x```json\n{"name"', " " * 9 + '{"name"', '{' + " " * 9 + '"name"'):
        assert pattern.match(text) is None, text
    longest = " " * 8 + "```" + " " * 4 + "json" + " " * 4 + "\r\n" + " " * 8 + "{" + " " * 8 + '"name"'
    assert pattern.match(longest) and len(longest) == CALL_OPENING_MAX <= ANCHOR_WINDOW


def test_auto_offers_the_openings_and_forced_choices_stay_as_they_were():
    body = {"tools": [WEATHER, TIME]}
    both, time_only = validate_tools([WEATHER, TIME]), validate_tools([TIME])
    auto = parse_structured(body, chat=True).sampling(SamplingParams(), H)
    assert auto.grammar_triggers == ("<tool_call>", CALL_OPENING)
    assert auto.grammar == tool_call_grammar(both, parallel=True, openings=True)
    for choice, tools in (("required", both),
                          ({"type": "function", "function": {"name": "get_time"}}, time_only)):
        forced = parse_structured({**body, "tool_choice": choice}, chat=True).sampling(
            SamplingParams(), H)
        assert forced.grammar_triggers == ()
        assert forced.grammar == tool_call_grammar(tools, parallel=True)
    assert "bare" not in tool_call_grammar([WEATHER, TIME], parallel=True)


def _feed(g: Grammar, text: str) -> None:
    """`text` through the grammar as the sampler passes tokens: watched while lazy, then accepted."""
    for t in g.model.tokenize(text, add_special=False, parse_special=False):
        if g.active:
            g.accept(t)
        else:
            g.watch(t)


def _ends(g: Grammar) -> bool:
    return any(g.allows(t) for t in g.model.eog_tokens)


AUTO_GRAMMAR = tool_call_grammar([WEATHER, TIME], parallel=True, openings=True)


@pytest.mark.parametrize("text", [
    CALL, '{\n  "name":\n  "get_time", "arguments": {"city": "Rome"}}', f"```json\n{CALL}\n```",
    f"```\n{CALL}\n```", f"{CALL} trailing", f"{CALL}\n{{", f"```json\n{CALL}\n```\n```",
    f"{CALL}\nThe weather in Paris is sunny.",
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>',
    '<tool_call>\n{"name": "get_time", "arguments": {"city": "Oslo"}}\n</tool_call>\n<tool_call>\n'
    '{"name": "get_time", "arguments": {"city": "Rome"}}\n</tool_call>',
])
def test_the_grammar_takes_bare_fenced_and_tagged_calls_to_their_end(llm, text):
    # After an untagged call the output is free: it may end there or go on.
    g = Grammar(llm.model, AUTO_GRAMMAR, (), GrammarBudget())
    try:
        _feed(g, text)
        assert _ends(g)
    finally:
        g.close()


@pytest.mark.parametrize("text", [
    '{"name": "hello.txt"', '{"name": "get_weather", "arguments": {"town": "Paris"}}',
    '```json\n{"city"', f"```json\n{CALL} trailing", '<tool_call>\n{"name": "get_time"} x',
])
def test_the_grammar_refuses_other_names_and_arguments(llm, text):
    g = Grammar(llm.model, AUTO_GRAMMAR, (), GrammarBudget())
    try:
        with pytest.raises(LlmctlError):
            _feed(g, text)
    finally:
        g.close()


@pytest.mark.parametrize("text, active", [
    (CALL, True), ('```json\n{\n  "name": "get_weather"', True), (' \n{ "name"', True),
    (f"Sure: {CALL}", False), ('{"city": "Paris"}', False), ('[{"name": "get_weather"', False),
    (" " * 100 + CALL, False), ("Let me check.\n<tool_call>\n" + CALL, True),
])
def test_the_anchored_trigger_fires_only_at_the_answer_start(llm, text, active):
    g = Grammar(llm.model, AUTO_GRAMMAR, ("<tool_call>", CALL_OPENING), GrammarBudget())
    try:
        _feed(g, text)
        assert g.active is active
    finally:
        g.close()


def test_text_the_grammar_refuses_after_an_anchored_match_leaves_the_output_free(llm):
    g = Grammar(llm.model, 'root ::= "<tool_call>" [a-z]*', ("<tool_call>", CALL_OPENING),
                GrammarBudget())
    try:
        _feed(g, '{"name": "x", then prose ')
        assert not g.active
        _feed(g, "<tool_call>ab")
        assert g.active and _ends(g)
    finally:
        g.close()


@pytest.fixture(scope="module")
def client(session_home):
    with qwen_server(session_home) as url:
        yield openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)


def _ask(client, messages, **kw):
    kw = {"temperature": 0, "max_tokens": 64, "tools": [WEATHER, TIME], **kw}
    if isinstance(messages, str):
        messages = [{"role": "user", "content": messages}]
    return client.chat.completions.create(model="qwen2.5-coder-0.5b", messages=messages, **kw)


@pytest.mark.slow
def test_auto_gets_a_valid_call_whole_and_streamed(client):
    # Left free, this model answers with a fenced, pretty-printed call object.
    raw = _ask(client, "What is the weather in Paris?", tool_choice="none").choices[0].message
    assert raw.content.startswith('```json\n{\n  "name": ')
    whole = _ask(client, "What is the weather in Paris?").choices[0]
    assert whole.finish_reason == "tool_calls", whole.message
    (call,) = whole.message.tool_calls
    assert call.function.name == "get_weather" and whole.message.content is None
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
    streamed: dict = {}
    for chunk in _ask(client, "What is the weather in Paris?", stream=True):
        for d in chunk.choices[0].delta.tool_calls or []:
            if d.id:
                streamed[d.index] = [d.function.name, d.function.arguments]
            else:
                streamed[d.index][1] += d.function.arguments
    assert list(streamed.values()) == [[call.function.name, call.function.arguments]]


def _shown(question: str, answer: str, then: str) -> list[dict]:
    return [{"role": "user", "content": question}, {"role": "assistant", "content": answer},
            {"role": "user", "content": then}]


@pytest.mark.slow
def test_json_and_prose_answers_stay_content_byte_for_byte(client):
    # An earlier turn shows the shape, so the model answers in it with tools offered.
    for messages in (_shown("a=1, b=2", '{"a": 1, "b": 2}', "a=3, b=4"),
                     _shown("List two numbers.", "[1, 2]", "List three numbers."),
                     _shown("Say hi.", "Hi!", "Say hello.")):
        raw = _ask(client, messages, tool_choice="none").choices[0].message.content
        whole = _ask(client, messages).choices[0]
        assert whole.finish_reason == "stop" and not whole.message.tool_calls
        assert whole.message.content == raw
        text = "".join(c.choices[0].delta.content or "" for c in _ask(client, messages, stream=True))
        assert text == raw
