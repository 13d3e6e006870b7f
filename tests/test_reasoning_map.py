"""How each protocol's reasoning fields map to the model's thought (on, off
or the template's default), and which of them a response names as not
applied, without a model."""

import pytest

from llmctl.errors import InvalidParams
from llmctl.runtime.formats.template import ChatTemplate, normalize_messages
from llmctl.runtime.formats.tool_calls import ToolFormat
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.answer_reader import AnswerReader, ToolSetup
from llmctl.server.anthropic.request import parse_messages
from llmctl.server.openai.request import parse_request as parse_chat
from llmctl.server.responses.request import parse_request as parse_responses
from llmctl.server.responses.store import ResponseStore

MSGS = [{"role": "user", "content": "hi"}]


def _anthropic(**fields):
    return parse_messages({"model": "m", "max_tokens": 8, "messages": MSGS, **fields}, False,
                          SamplingParams())


@pytest.mark.parametrize("fields, on, blocks, off_model, on_model", [
    ({}, None, False, [], []),
    ({"thinking": {"type": "adaptive"}}, True, True, [], []),
    ({"thinking": {"type": "enabled", "budget_tokens": 64}}, True, True,
     ["thinking", "thinking.budget_tokens"], ["thinking.budget_tokens"]),
    ({"thinking": {"type": "disabled"}}, False, False, [], []),
    ({"output_config": {"effort": "low"}}, True, True,
     ["output_config.effort"], []),
    # Claude Code's: the effort applies where the template thinks.
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}}, True, True,
     ["output_config.effort"], []),
    # No thought for the effort to shape: it is never applied.
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, False, False,
     ["output_config.effort"], ["output_config.effort"]),
])
def test_anthropic_thinking_and_effort(fields, on, blocks, off_model, on_model):
    req = _anthropic(**fields)
    assert (req.think.on, req.thinking) == (on, blocks)
    assert req.think.named(req.ignored, thinks=False) == off_model
    assert req.think.named(req.ignored, thinks=True) == on_model


def _responses(tmp_path, **fields):
    return parse_responses({"input": "hi", **fields}, True, SamplingParams(),
                           store=ResponseStore(tmp_path, 10, 1 << 20))


@pytest.mark.parametrize("reasoning, on, off_model, on_model", [
    (None, None, [], []),
    ({"effort": "none"}, False, [], []),
    ({"effort": "minimal"}, False, [], []),
    ({"effort": "medium"}, True, ["reasoning.effort"], []),
    ({"effort": "high", "summary": "auto"}, True, ["reasoning.effort", "reasoning.summary"],
     ["reasoning.summary"]),
])
def test_responses_reasoning_effort(tmp_path, reasoning, on, off_model, on_model):
    req = _responses(tmp_path, reasoning=reasoning)
    assert req.think.on is on
    assert req.think.named(req.ignored, thinks=False) == off_model
    assert req.think.named(req.ignored, thinks=True) == on_model


@pytest.mark.parametrize("effort, on", [(None, None), ("none", False), ("minimal", False),
                                        ("low", True), ("high", True)])
def test_chat_reasoning_effort(effort, on):
    req = parse_chat({"messages": MSGS, "reasoning_effort": effort}, True, SamplingParams())
    assert req.think.on is on
    assert req.think.named(req.think.fields, thinks=False) == (["reasoning_effort"] if on else [])


def test_bad_efforts_are_400s_naming_the_field(tmp_path):
    with pytest.raises(InvalidParams) as e:
        parse_chat({"messages": MSGS, "reasoning_effort": "huge"}, True, SamplingParams())
    assert e.value.param == "reasoning_effort"
    with pytest.raises(InvalidParams) as e:
        parse_chat({"prompt": "x", "reasoning_effort": "low"}, False, SamplingParams())
    assert e.value.param == "reasoning_effort"
    with pytest.raises(InvalidParams) as e:
        _responses(tmp_path, reasoning={"effort": "huge"})
    assert e.value.param == "reasoning"


# ---- past thoughts in the history --------------------------------------------------

# A template that reads past thoughts, as Qwen3's does.
READS = ChatTemplate("{% for m in messages %}<|{{ m.role }}|>{% if m.reasoning_content %}"
                     "<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content or '' }}\n"
                     "{% endfor %}<|assistant|>{# tools #}")


def test_a_responses_reasoning_item_becomes_the_next_turns_thought(tmp_path):
    store = ResponseStore(tmp_path, 10, 1 << 20)
    sealed = store.seal("sealed thought")
    items = [{"role": "user", "content": "hi"},
             {"type": "reasoning", "id": "rs_1", "summary": [],
              "content": [{"type": "reasoning_text", "text": "raw thought"}]},
             {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
             {"type": "function_call_output", "call_id": "c1", "output": "42"},
             {"type": "reasoning", "id": "rs_2", "encrypted_content": sealed,
              "summary": [{"type": "summary_text", "text": "a summary"}]},
             {"role": "assistant", "content": [{"type": "output_text", "text": "42"}]},
             {"role": "user", "content": "and?"}]
    req = parse_responses({"input": items}, True, SamplingParams(), store=store)
    thoughts = [m.get("reasoning_content") for m in req.messages if m["role"] == "assistant"]
    assert thoughts == ["raw thought", "sealed thought"]
    prompt = READS.render(normalize_messages(req.messages))
    assert "<think>raw thought</think>" in prompt and "<think>sealed thought</think>42" in prompt
    # A template that does not read past thoughts never shows them.
    assert "thought" not in ChatTemplate(None).render(normalize_messages(
        [m for m in req.messages if m["role"] != "tool" and not m.get("tool_calls")]))


def test_a_summary_stands_for_a_thought_not_sent_whole(tmp_path):
    items = [{"role": "user", "content": "hi"},
             {"type": "reasoning", "summary": [{"type": "summary_text", "text": "short"}]},
             {"role": "assistant", "content": "ok"}]
    req = _responses(tmp_path, input=items)
    assert req.messages[1] == {"role": "assistant", "content": "ok", "reasoning_content": "short"}


def test_anthropic_thinking_blocks_reach_a_template_that_reads_them():
    turn = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "two and two", "signature": ""},
        {"type": "redacted_thinking", "data": "opaque"}, {"type": "text", "text": "4"}]}
    req = _anthropic(messages=[*MSGS, turn, {"role": "user", "content": "sure?"}])
    assert "<think>two and two</think>4" in READS.render(normalize_messages(req.messages))
    cleared = _anthropic(messages=[*MSGS, turn, {"role": "user", "content": "sure?"}],
                         context_management={"edits": [{"type": "clear_thinking_20251015",
                                                        "keep": {"type": "thinking_turns",
                                                                 "value": 0}}]})
    assert "two and two" not in READS.render(normalize_messages(cleared.messages))


# ---- reasoning_tokens -----------------------------------------------------------------


def test_the_tokens_before_the_answer_are_the_thoughts():
    reader = AnswerReader(ToolSetup(ToolFormat.HERMES, frozenset(), started_in_thought=True))
    for piece in ["two", " and", " two", "</think>", "\n\n", "Four", "."]:
        reader.feed(piece)
    assert reader.reasoning_tokens == 5
    plain = AnswerReader(ToolSetup(ToolFormat.HERMES, frozenset()))
    for piece in ["Four", "."]:
        plain.feed(piece)
    assert plain.reasoning_tokens == 0
