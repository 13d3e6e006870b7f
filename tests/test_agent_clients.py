"""Third-party agent clients offering tools with tool_choice "auto" against a
real `llmctl serve qwen2.5-coder-0.5b`: LangChain's bind_tools, pydantic-ai
and the OpenAI Agents SDK over chat completions each get their tool called
(Qwen2.5-Coder-0.5B often answers with a bare call object, which the
anchored trigger constrains and the parser reads as a call)."""

from __future__ import annotations

import asyncio

import pytest

from conftest import qwen_server

pytestmark = pytest.mark.slow

MODEL = "qwen2.5-coder-0.5b"
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def base_url(session_home):
    with qwen_server(session_home, ctx_size=4096) as url:
        yield url + "/v1"


def test_langchain_bind_tools_gets_a_tool_call(base_url):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        return f"Sunny in {city}"

    llm = ChatOpenAI(model=MODEL, base_url=base_url, api_key="x", temperature=0, max_tokens=64,
                     max_retries=0)
    msg = llm.bind_tools([get_weather]).invoke(QUESTION)
    assert [c["name"] for c in msg.tool_calls] == ["get_weather"], msg
    assert isinstance(msg.tool_calls[0]["args"].get("city"), str)


def test_pydantic_ai_agent_calls_its_tool(base_url):
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    called: list[str] = []

    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"Sunny and 21 C in {city}"

    model = OpenAIChatModel(MODEL, provider=OpenAIProvider(base_url=base_url, api_key="x"))
    agent = Agent(model, tools=[get_weather],
                  model_settings={"temperature": 0, "max_tokens": 64})

    async def until_called() -> None:
        # Stop once the tool ran: after its result this 0.5B model calls it
        # again (it echoes its last turn), so the run would not end by itself.
        async with agent.iter(QUESTION) as run:
            async for _node in run:
                if called:
                    return

    asyncio.run(until_called())
    assert called == ["Paris"]


def test_openai_agents_sdk_over_chat_completions_calls_its_tool(base_url):
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    called: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """Current weather in a city."""
        called.append(city)
        return f"Sunny and 21 C in {city}"

    client = AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    agent = Agent(name="weather", instructions="Answer with the tools you have.",
                  model=OpenAIChatCompletionsModel(model=MODEL, openai_client=client),
                  model_settings=ModelSettings(temperature=0, max_tokens=64),
                  tools=[get_weather], tool_use_behavior="stop_on_first_tool")
    result = asyncio.run(Runner.run(agent, QUESTION, max_turns=3))
    assert called and result.final_output == f"Sunny and 21 C in {called[0]}"
