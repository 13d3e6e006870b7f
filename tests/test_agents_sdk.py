"""The OpenAI Agents SDK on its default model class, OpenAIResponsesModel
(the Responses API), against a real `llmctl serve qwen2.5-coder-0.5b`: an
agent with one function tool calls it and finishes."""

from __future__ import annotations

import asyncio

import openai
import pytest

from conftest import qwen_server

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def url(session_home):
    with qwen_server(session_home) as served:
        yield served


def test_agent_calls_its_tool_and_finishes(url):
    from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool
    from agents.tracing import set_tracing_disabled

    set_tracing_disabled(True)          # nothing may leave this machine
    calls: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny and 21 C in {city}."

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    # tool_choice stays the SDK's default, "auto": the model chooses to call.
    # Handed the result, the 0.5B model echoes its call instead of answering,
    # so the agent finishes on its first tool result (stop_on_first_tool).
    agent = Agent(name="weather", instructions="Answer weather questions with the tool.",
                  tools=[get_weather], tool_use_behavior="stop_on_first_tool",
                  model=OpenAIResponsesModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=64))
    result = asyncio.run(Runner.run(agent, "What's the weather in Paris?", max_turns=4))
    assert calls and "paris" in calls[0].lower()
    assert result.final_output == "It is sunny and 21 C in Paris."
    [call] = [i for i in result.new_items if i.type == "tool_call_item"]
    assert call.raw_item.name == "get_weather"
