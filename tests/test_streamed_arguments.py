"""Tool-call arguments that stream as the model writes them (issue 22): the
parser's constrained mode, where the tool-call grammar writes the calls,
read however the text is chunked; then a real `llmctl serve
qwen2.5-coder-0.5b` streaming a long argument through the official
`anthropic` and `openai` clients and raw Chat Completions."""

from __future__ import annotations

import json
import random

import anthropic
import httpx
import openai
import pytest

from conftest import qwen_server
from llmctl.runtime.formats.call_stream import arguments_object
from llmctl.runtime.formats.tool_calls import (
    TextDelta,
    ToolCallDelta,
    ToolCallDone,
    ToolCallParser,
    ToolFormat,
    call_id_factory,
    collect,
    parse_tool_calls,
)

H = ToolFormat.HERMES
NAMES = {"get_weather", "search"}
W_ARGS = '{"city": "Paris", "unit": "C"}'
S_ARGS = '{"q": "a \\"quoted\\" {brace} </tool_call> ``` \\\\", "n": [1, {"x": "}"}]}'
COMPACT_S = json.dumps(json.loads(S_ARGS), separators=(",", ":"))
WEATHER = '{"name": "get_weather", "arguments": ' + W_ARGS + '}'
SEARCH = '{"name": "search", "arguments": ' + S_ARGS + '}'


def ids():
    return call_id_factory(random.Random(3))


def chunkings(text: str, rng: random.Random):
    """Char by char, whole, token-like pieces (words and punctuation), and
    random cuts."""
    yield list(text)
    yield [text]
    pieces, word = [], ""
    for c in text:
        if c.isalnum():
            word += c
            continue
        pieces += [p for p in (word, c) if p]
        word = ""
    yield pieces + ([word] if word else [])
    for _ in range(25):
        k = min(len(text) - 1, rng.randint(1, 16))
        cuts = sorted(rng.sample(range(1, len(text)), k=k))
        yield [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def streamed(chunks: list[str], **kw) -> tuple[list, ToolCallParser]:
    stream = ToolCallParser(H, NAMES, new_id=ids(), constrained=True, **kw)
    return [d for c in chunks for d in stream.feed(c)] + stream.finish(), stream


# (output, content, [(name, arguments text)], cut)
CASES = [
    (f"<tool_call>\n{WEATHER}\n</tool_call>", None, [("get_weather", W_ARGS)], False),
    (f"Let me look.\n<tool_call>\n{SEARCH}\n</tool_call>\n<tool_call>\n{WEATHER}\n</tool_call>",
     "Let me look.", [("search", S_ARGS), ("get_weather", W_ARGS)], False),
    ('<tool_call>\n{"name":"search","arguments":{}}\n</tool_call>', None, [("search", "{}")], False),
    (f"```xml\n<tool_call>\n{SEARCH}\n</tool_call>\n```", None, [("search", S_ARGS)], False),
    (f"```json\n{SEARCH}\n```\nDone.", "Done.", [("search", S_ARGS)], False),
    (f"\n```\n  {WEATHER}\n```", None, [("get_weather", W_ARGS)], False),
    # A second fence is in the grammar's free text: read as without it.
    (f"```json\n{WEATHER}\n```\n```json\n{SEARCH}\n```", None,
     [("get_weather", W_ARGS), ("search", COMPACT_S)], False),
    # Cut short (max_tokens, a stop string): the call stands, arguments so far.
    ('<tool_call>\n{"name": "search", "arguments": {"q": "par', None,
     [("search", '{"q": "par')], True),
    ('<tool_call>\n{"name": "search", "argu', None, [("search", "")], True),
    (f"<tool_call>\n{WEATHER}\n</tool", None, [("get_weather", W_ARGS)], False),
    ('```json\n{"name": "search", "arguments": {"q": "\\', None, [("search", '{"q": "\\')], True),
]


@pytest.mark.parametrize("text, content, calls, cut", CASES)
def test_grammar_calls_stream_their_arguments_for_any_chunking(text, content, calls, cut):
    whole = parse_tool_calls(text, H, NAMES, new_id=ids(), constrained=True)
    assert whole.content == content
    assert [(c.name, c.arguments) for c in whole.tool_calls] == calls
    for chunks in chunkings(text, random.Random(text)):
        deltas, stream = streamed(chunks)
        assert collect(deltas) == whole, chunks
        assert stream.cut is cut
        heads = [d.index for d in deltas if isinstance(d, ToolCallDelta) and d.id]
        assert heads == list(range(len(calls)))


def test_a_head_and_argument_pieces_come_while_the_call_is_written():
    text = f"<tool_call>\n{SEARCH}\n</tool_call>"
    stream = ToolCallParser(H, NAMES, new_id=ids(), constrained=True)
    seen: list[tuple[int, ToolCallDelta]] = []
    for i, c in enumerate(text):
        seen += [(i, d) for d in stream.feed(c) if isinstance(d, ToolCallDelta)]
    seen += [(len(text), d) for d in stream.finish()]
    head_at = next(i for i, d in seen if d.id)
    assert head_at == text.index('"search"') + len('"search"') - 1      # at the name's end
    pieces = [d.arguments for _, d in seen if d.id is None]
    assert len(pieces) > 20 and "".join(pieces) == S_ARGS
    assert seen[-1][0] < text.rindex("</tool_call>")    # done before the close is read


@pytest.mark.parametrize("text", [
    f"{WEATHER}",                                       # bare: a call only as the whole answer
    f"{WEATHER} and some text after it",
    f"{WEATHER}\n<tool_call>\n{SEARCH}\n</tool_call>",   # after the lazy grammar's free text
    f"<think>plan</think>\n```json\n{SEARCH}\n```",     # after a thought: no anchored start
    f"```tool_call\n{SEARCH}\n```",                     # a fence the trigger does not open
    '<tool_call>\n{"name": "rm", "arguments": {}}\n</tool_call>',  # not a tool: content
    '<tool_call>\n{"name": "sea',                       # cut before the name is known
])
def test_calls_the_grammar_is_not_sure_of_are_read_as_without_it(text):
    whole = parse_tool_calls(text, H, NAMES, new_id=ids())
    assert parse_tool_calls(text, H, NAMES, new_id=ids(), constrained=True) == whole
    for chunks in chunkings(text, random.Random(text)):
        deltas, stream = streamed(chunks)
        assert collect(deltas) == whole, chunks
        assert not stream.cut


def test_a_bare_call_is_held_until_the_answer_ends():
    stream = ToolCallParser(H, NAMES, new_id=ids(), constrained=True)
    assert stream.feed(WEATHER) == []
    out = stream.finish()
    assert [type(d) for d in out] == [ToolCallDelta, ToolCallDelta, ToolCallDone]
    assert json.loads(out[1].arguments) == json.loads(W_ARGS)


def test_other_formats_ignore_the_flag():
    text = '{"name": "search", "parameters": {"q": "x"}}'
    for fmt in (ToolFormat.LLAMA3, ToolFormat.GENERIC):
        assert (parse_tool_calls(text, fmt, NAMES, new_id=ids(), constrained=True)
                == parse_tool_calls(text, fmt, NAMES, new_id=ids()))


@pytest.mark.parametrize("text, value", [
    (W_ARGS, {"city": "Paris", "unit": "C"}),
    ("", {}),
    ('{"path": "a.txt", "content": "Roses are', {"path": "a.txt", "content": "Roses are"}),
    ('{"path": "a.txt", "content": "x\\', {"path": "a.txt", "content": "x"}),
    ('{"path": "a.txt", "cont', {"path": "a.txt"}),
    ('{"a": {"b": [1, 2', {"a": {"b": [1]}}),
    ('{"a": 1, "b": tru', {"a": 1}),
    ('{"a": ', {}),
    ("[1, 2]", {}),
])
def test_arguments_object_reads_what_a_cut_call_wrote(text, value):
    assert arguments_object(text) == value


def test_no_argument_text_leaks_into_content():
    text = f"<tool_call>\n{WEATHER}\n</tool_call>"
    deltas, _ = streamed(list(text))
    assert not [d for d in deltas if isinstance(d, TextDelta)]


# ---- a real server ---------------------------------------------------------

MODEL = "qwen2.5-coder-0.5b"
POEM = ("Save this poem to the file poem.txt: 'Roses are red, violets are blue, "
        "the sea is deep and so are you.'")
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"},
                                           "content": {"type": "string"}},
          "required": ["path", "content"]}
WRITE = {"type": "function", "function": {"name": "write_file", "parameters": SCHEMA,
                                          "description": "Write text to a file"}}


@pytest.fixture(scope="module")
def server(session_home):
    with qwen_server(session_home) as url:
        yield url


@pytest.mark.slow
def test_anthropic_stream_sends_input_in_pieces_that_join_to_the_input(server):
    client = anthropic.Anthropic(base_url=server, api_key="x", max_retries=0)
    tool = {"name": "write_file", "description": "Write text to a file", "input_schema": SCHEMA}
    with client.messages.stream(model=MODEL, max_tokens=96, tools=[tool],
                                tool_choice={"type": "tool", "name": "write_file"},
                                messages=[{"role": "user", "content": POEM}],
                                extra_body={"temperature": 0}) as stream:
        pieces = [e.delta.partial_json for e in stream
                  if e.type == "content_block_delta" and e.delta.type == "input_json_delta"]
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "write_file"
    assert len(pieces) >= 2 and final.stop_reason == "tool_use"
    assert json.loads("".join(pieces)) == uses[0].input
    assert uses[0].input["content"]


@pytest.mark.slow
def test_responses_stream_arguments_join_to_the_done_and_the_item(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="x", max_retries=0)
    tool = {"type": "function", "name": "write_file", "description": "Write text to a file",
            "parameters": SCHEMA}
    with client.responses.stream(model=MODEL, input=POEM, tools=[tool], temperature=0,
                                 tool_choice={"type": "function", "name": "write_file"},
                                 max_output_tokens=96) as stream:
        events = list(stream)
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = [e.arguments for e in events if e.type == "response.function_call_arguments.done"]
    items = [e.item for e in events if e.type == "response.output_item.done"
             and e.item.type == "function_call"]
    assert len(pieces) >= 2 and len(done) == len(items) == 1
    assert "".join(pieces) == done[0] == items[0].arguments
    assert items[0].name == "write_file"


@pytest.mark.slow
def test_chat_stream_arguments_join_to_the_whole_answers(server):
    body = {"model": MODEL, "messages": [{"role": "user", "content": POEM}], "tools": [WRITE],
            "tool_choice": {"type": "function", "function": {"name": "write_file"}},
            "temperature": 0, "max_tokens": 96}
    with httpx.Client(base_url=server, timeout=300) as http:
        whole = http.post("/v1/chat/completions", json=body).json()["choices"][0]
        pieces, finish = [], None
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                choice = json.loads(line[6:])["choices"][0]
                finish = choice["finish_reason"] or finish
                for call in choice["delta"].get("tool_calls") or ():
                    if call["function"].get("arguments"):
                        pieces.append(call["function"]["arguments"])
    call = whole["message"]["tool_calls"][0]["function"]
    assert call["name"] == "write_file" and len(pieces) >= 2
    assert "".join(pieces) == call["arguments"]
    assert finish == whole["finish_reason"] == "tool_calls"
    assert set(json.loads(call["arguments"])) == {"path", "content"}
