"""Tools in chat templates, rendered with the real templates of two
installed models: Qwen2.5-Coder (Hermes-style <tools>/<tool_call>) and
SmolLM2 (plain ChatML, no tools)."""

from __future__ import annotations

import json

import pytest

from conftest import smollm2_file
from llmctl.errors import InvalidParams, TemplateError
from llmctl.runtime.formats.template import ChatTemplate, normalize_messages
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.store.gguf_header import read_header
from llmctl.store.gguf_info import read_gguf_info
from llmctl.store.pypi_parts import locate_parts
from llmctl.store.registry import load_registry

QWEN_SYSTEM = ("<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. "
               "You are a helpful assistant.<|im_end|>\n")
WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city; returns <celsius> & wind.",
    "parameters": {"type": "object", "required": ["city"],
                   "properties": {"city": {"type": "string", "description": "e.g. Zürich"}}}}}
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}
ROUND_TRIP = [
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": None, "tool_calls": [CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "21 C, calm"}]},
]


@pytest.fixture(scope="module")
def qwen() -> ChatTemplate:
    # The template is in the GGUF header, which lies wholly in the first part
    # package: reading it there spares assembling the 490 MB model.
    first = locate_parts(load_registry().get("qwen2.5-coder-0.5b"))[0]
    source = read_header(first).metadata["tokenizer.chat_template"]
    return ChatTemplate(source, eos_token="<|im_end|>")


@pytest.fixture(scope="module")
def smollm2() -> ChatTemplate:
    return ChatTemplate(read_gguf_info(smollm2_file()).chat_template)


def test_qwen_prompt_without_tools_is_plain_chatml(qwen):
    msgs = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}]
    assert qwen.render(normalize_messages(msgs)) == (
        "<|im_start|>system\nBe terse.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
        "<|im_start|>assistant\nhello<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert qwen.render(normalize_messages(msgs[1:2]), add_generation_prompt=False) == \
        QWEN_SYSTEM + "<|im_start|>user\nhi<|im_end|>\n"


def test_qwen_lists_tools_as_transformers_does(qwen):
    assert qwen.supports_tools and qwen.tool_format is ToolFormat.HERMES
    prompt = qwen.render(normalize_messages(ROUND_TRIP[:1]), [WEATHER])
    # Key order kept and nothing HTML-escaped, as transformers' tojson writes it.
    schema = json.dumps(WEATHER, ensure_ascii=False)
    assert f"<tools>\n{schema}\n</tools>" in prompt
    assert prompt.startswith("<|im_start|>system\nYou are Qwen")
    assert prompt.endswith("<|im_start|>user\nWeather in Zürich?<|im_end|>\n<|im_start|>assistant\n")


def test_qwen_round_trip_renders_calls_and_results(qwen):
    prompt = qwen.render(normalize_messages(ROUND_TRIP), [WEATHER])
    assert prompt.endswith(
        "<|im_start|>user\nWeather in Zürich?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21 C, calm\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")


def test_qwen_groups_parallel_results_in_one_turn(qwen):
    second = {"id": "call_2", "type": "function",
              "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
    msgs = [ROUND_TRIP[0], {"role": "assistant", "content": "Checking both.", "tool_calls": [CALL, second]},
            {"role": "tool", "tool_call_id": "call_1", "content": "21 C"},
            {"role": "tool", "tool_call_id": "call_2", "name": "get_weather", "content": "18 C"}]
    prompt = qwen.render(normalize_messages(msgs), [WEATHER], add_generation_prompt=False)
    assert prompt.endswith(
        "<|im_start|>assistant\nChecking both.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>\n<tool_call>\n'
        '{"name": "get_weather", "arguments": {"city": "Bern"}}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n<tool_response>\n21 C\n</tool_response>\n"
        "<tool_response>\n18 C\n</tool_response><|im_end|>\n")


def test_normalized_history_shape():
    assert normalize_messages(ROUND_TRIP)[1:] == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich"}},
             "arguments_json": '{"city": "Zürich"}'}]},
        {"role": "tool", "content": "21 C, calm", "tool_call_id": "call_1"}]
    # No calls is a plain assistant message, as before tools existed.
    assert normalize_messages([{"role": "assistant", "content": "x", "tool_calls": []}]) == \
        [{"role": "assistant", "content": "x"}]


def test_normalizing_twice_renders_the_same_prompt(qwen):
    # The server normalizes a request's messages and LLM.chat_tokens does so
    # again: the second pass must accept the first's output unchanged in effect.
    once = normalize_messages(ROUND_TRIP)
    assert qwen.render(normalize_messages(once), [WEATHER]) == qwen.render(once, [WEATHER])


def test_smollm2_template_refuses_tools(smollm2):
    assert "tools" not in smollm2.source
    assert not smollm2.supports_tools and smollm2.tool_format is ToolFormat.NONE
    with pytest.raises(InvalidParams, match="does not support tools") as e:
        smollm2.render(normalize_messages(ROUND_TRIP[:1]), [WEATHER])
    assert e.value.param == "tools"
    # Without tools the prompt is what it always was.
    assert smollm2.render(normalize_messages(ROUND_TRIP[:1]), []) == smollm2.render(
        [{"role": "user", "content": "Weather in Zürich?"}])


def test_chatml_fallback_refuses_tools():
    with pytest.raises(InvalidParams) as e:
        ChatTemplate(None).render([{"role": "user", "content": "hi"}], [WEATHER])
    assert e.value.param == "tools"


def test_tool_calls_in_history_are_never_dropped_silently(smollm2):
    with pytest.raises(InvalidParams, match=r"messages\[1\]\.tool_calls") as e:
        smollm2.render(normalize_messages(ROUND_TRIP))
    assert e.value.param == "messages"


def test_tools_variable_is_none_without_tools_as_in_transformers():
    t = ChatTemplate("{% if tools is none %}none{% else %}{{ tools | length }}{% endif %}")
    msgs = [{"role": "user", "content": "hi"}]
    assert [t.render(msgs), t.render(msgs, []), t.render(msgs, [WEATHER])] == ["none", "none", "1"]


@pytest.mark.parametrize("tools, where", [
    ({"type": "function"}, "tools must be a list"),
    ([{"type": "function", "function": {"name": "has space"}}], r"tools\[0\]\.function\.name"),
    ([WEATHER, WEATHER], r"tools\[1\]\.function\.name"),
])
def test_malformed_tools_name_the_entry(qwen, tools, where):
    with pytest.raises(InvalidParams, match=where) as e:
        qwen.render([{"role": "user", "content": "hi"}], tools)
    assert e.value.param == "tools"


def _history(**changes) -> list[dict]:
    msgs = [dict(m) for m in ROUND_TRIP]
    for key, value in changes.items():
        i, field = key.split("_", 1)
        msgs[int(i[1:])][field] = value
    return msgs


@pytest.mark.parametrize("messages, where", [
    (_history(m1_tool_calls={"id": "call_1"}), r"messages\[1\]\.tool_calls must be a list"),
    (_history(m1_tool_calls=[{"type": "function", "function": CALL["function"]}]),
     r"messages\[1\]\.tool_calls\[0\]\.id"),
    (_history(m1_tool_calls=[{**CALL, "function": {"name": "get_weather", "arguments": "{city"}}]),
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    (_history(m1_tool_calls=[{**CALL, "function": {"name": "get_weather", "arguments": "[1]"}}]),
     r"messages\[1\]\.tool_calls\[0\]\.function\.arguments"),
    (_history(m1_tool_calls=[{**CALL, "type": "code"}]), r"messages\[1\]\.tool_calls\[0\]\.type"),
    (_history(m1_function_call={"name": "get_weather", "arguments": "{}"}),
     r"messages\[1\]\.function_call"),
    (_history(m0_tool_calls=[CALL]), r"messages\[0\]\.tool_calls is only allowed in assistant"),
    (_history(m2_tool_call_id=None), r"messages\[2\]\.tool_call_id"),
    (_history(m2_tool_call_id=7), r"messages\[2\]\.tool_call_id"),
    (_history(m2_name=["get_weather"]), r"messages\[2\]\.name"),
    (_history(m2_content=21), r"messages\[2\]\.content"),
    (_history(m2_content=[{"type": "image_url", "image_url": {"url": "x"}}]), r"messages\[2\]\.content\[0\]"),
])
def test_malformed_history_names_the_field(messages, where):
    with pytest.raises(InvalidParams, match=where) as e:
        normalize_messages(messages)
    assert e.value.param == "messages" and e.value.http_status == 400


@pytest.mark.parametrize("payload", [
    "{{ tools[0].__class__.__mro__[1].__subclasses__() }}",
    "{{ tools[0].function.parameters.__init__.__globals__ }}",
    "{{ tools.append(1) }}{{ tools }}",
    "{{ tools[0].function.update({'name': 'rm'}) }}",
    "{# tools #}{{ messages[1].tool_calls[0].function.arguments.clear() }}",
])
def test_tools_cannot_be_used_to_leave_or_change_the_sandbox(payload):
    tools = json.loads(json.dumps([WEATHER]))
    with pytest.raises(TemplateError):
        ChatTemplate(payload).render(normalize_messages(ROUND_TRIP), tools)
    assert tools == [WEATHER]
