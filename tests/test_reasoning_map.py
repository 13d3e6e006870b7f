"""How each protocol's reasoning fields map to the model's thought (on, off
or the template's default), and which of them a response names as not
applied, without a model."""

import pytest

from llmctl.errors import InvalidParams
from llmctl.runtime.sampling import SamplingParams
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
