"""The OpenAI Agents SDK against a real `llmctl serve` on the default
model (Qwen2.5-Coder-1.5B): an agent with one function tool calls it and
answers from its result, over Chat Completions (Runner.run and
run_streamed, with tool_choice auto and required) and over the SDK's
default model class, OpenAIResponsesModel (the Responses API)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from llmctl.bench.launcher import Server

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-1.5b"


@pytest.fixture(scope="module")
def url(session_home):
    with Server.llmctl_serve(MODEL, "--ctx-size", "4096", "--max-num-seqs", "2",
                             env={"LLMCTL_HOME": str(session_home)}) as srv:
        yield srv.wait_ready(900).url


def _agent(url: str, api: str, choice: str | None, calls: list[str]):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        function_tool,
    )
    from agents.tracing import set_tracing_disabled

    set_tracing_disabled(True)          # nothing may leave this machine

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        calls.append(city)
        return f"It is sunny and 21 C in {city}."

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
    model_class = OpenAIResponsesModel if api == "responses" else OpenAIChatCompletionsModel
    return Agent(name="weather", instructions="Answer weather questions with the tool.",
                 tools=[get_weather], model=model_class(model=MODEL, openai_client=client),
                 model_settings=ModelSettings(temperature=0, max_tokens=128, tool_choice=choice))


async def _streamed(agent, question: str):
    from agents import Runner

    run = Runner.run_streamed(agent, question, max_turns=4)
    async for _ in run.stream_events():
        pass
    return run


@pytest.mark.parametrize("api, streamed, choice", [
    ("chat", False, None), ("chat", True, None),
    ("chat", False, "required"), ("chat", True, "required"),
    ("responses", False, None),
])
def test_agent_calls_its_tool_and_answers(url, api, streamed, choice):
    from agents import Runner

    calls: list[str] = []
    agent = _agent(url, api, choice, calls)
    question = "What's the weather in Paris?"
    result = asyncio.run(_streamed(agent, question) if streamed
                         else Runner.run(agent, question, max_turns=4))
    assert calls and "paris" in calls[0].lower()
    [call] = [i for i in result.new_items if i.type == "tool_call_item"][:1]
    assert call.raw_item.name == "get_weather"
    answer = str(result.final_output).lower()
    assert "sunny" in answer and "21" in answer, answer
    assert "get_weather" not in answer and "{" not in answer, answer
