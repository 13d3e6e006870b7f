"""A model using MCP tools in the terminal (`chat --mcp`, `run --mcp`): the
model sees the servers' tools; when it calls one, the call is shown, run
(after the user's yes, unless the tool says it only reads or --yes was
given), its result shown in short and fed back, until the model answers or
`max_steps` calls were made. The tool-call grammar keeps every call well
formed (server/tool_protocol.py, as for any request with tools)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Protocol

from llmctl.errors import InvalidParams, LlmctlError
from llmctl.runtime.formats.tool_calls import TextDelta, ToolCall, ToolCallParser, collect
from llmctl.runtime.formats.tool_schema import ToolChoice, validate_tools
from llmctl.runtime.llm import LLM
from llmctl.runtime.sampling import SamplingParams
from llmctl.server.tool_protocol import Structured
from llmctl.tools.mcp_hub import McpHub, McpOutcome, McpTool

DEFAULT_MAX_STEPS = 8
WITHDRAWN = ("No more tool calls are possible. Answer the question now, from the tool "
             "results above.")


@dataclass(frozen=True)
class Route:
    """A function the model sees, and the MCP tool it runs."""

    function: str           # the name the model calls: the tool's own, or label__tool
    tool: McpTool


def routes_of(tools: list[McpTool]) -> dict[str, Route]:
    """Each tool under its own name, or `label__name` where two servers
    offer the same name; names the function schema refuses are left out."""
    seen: dict[str, int] = {}
    for t in tools:
        seen[t.name] = seen.get(t.name, 0) + 1
    out = {}
    for t in tools:
        name = t.name if seen[t.name] == 1 else f"{t.server}__{t.name}"
        out[name[:64]] = Route(name[:64], t)
    return out


def function_tools(routes: dict[str, Route]) -> list[dict]:
    """The tools in OpenAI's function shape, as the chat template reads them.
    A tool whose schema the checks refuse is left out."""
    out = []
    for name, route in routes.items():
        spec = {"type": "function", "function": {
            "name": name, "description": route.tool.description,
            "parameters": route.tool.input_schema or {"type": "object", "properties": {}}}}
        try:
            out += validate_tools([spec])
        except InvalidParams:
            continue
    return out


class Watcher(Protocol):
    """What the terminal shows and asks along the way."""

    def text(self, piece: str) -> None: ...
    def call(self, route: Route | None, name: str, arguments: dict) -> None: ...
    def approve(self, route: Route, arguments: dict) -> bool: ...
    def result(self, route: Route | None, outcome: McpOutcome) -> None: ...


@dataclass
class Turn:
    """What one turn did: the answer, and each call with its outcome."""

    answer: str
    calls: list[tuple[str, dict, McpOutcome]]
    stopped: bool = False       # max_steps calls were made: the answer came without tools


def _arguments(call: ToolCall) -> dict:
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def call_key(name: str, arguments: object) -> tuple[str, str]:
    """What makes two calls the same call: the name and the arguments
    (JSON text or its value), keys sorted."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            pass
    return name, json.dumps(arguments, sort_keys=True)


def _ask(llm: LLM, messages: list[dict], tools: list[dict], params: SamplingParams,
         on_text: Callable[[str], None]) -> tuple[str, list[ToolCall]]:
    """One generation with the tools offered: its text (streamed to
    `on_text` as it is read) and the calls it made."""
    fmt = llm.tool_format
    structured = Structured(tools or None, ToolChoice("auto" if tools else "none"))
    tokens = llm.chat_tokens(messages, tools or None)
    setup = structured.setup(fmt, "auto", thinks=llm.thinks,
                             started_in_thought=llm.opens_thought(tokens))
    parser = ToolCallParser(fmt, set(setup.names) if setup else set(),
                            setup.reasoning if setup else False,
                            started_in_thought=bool(setup and setup.started_in_thought),
                            constrained=bool(setup and setup.constrained),
                            doubled=llm.chat_template().teaches_doubled_braces)
    deltas = []

    def show(new: list) -> None:
        deltas.extend(new)
        for d in new:
            if isinstance(d, TextDelta) and d.text:
                on_text(d.text)

    llm.complete(tokens, structured.sampling(params, fmt), lambda text: show(parser.feed(text)))
    show(parser.finish())
    parsed = collect(deltas)
    return parsed.content or "", parsed.tool_calls


def run_turn(llm: LLM, messages: list[dict], params: SamplingParams, hub: McpHub,
             watcher: Watcher, *, max_steps: int = DEFAULT_MAX_STEPS,
             approve_all: bool = False) -> Turn:
    """Answer the conversation `messages` (extended in place with the
    calls, their results and the answer), running the tools it calls.
    Raises McpError when a server cannot list its tools, and what
    generation raises."""
    routes = routes_of(hub.all_tools())
    tools = function_tools(routes)
    turn = Turn("", [])
    done: dict[tuple[str, str], McpOutcome] = {}
    withdrawn = False
    while True:
        offered = [] if withdrawn else tools
        text, calls = _ask(llm, messages, offered, params, watcher.text)
        if not calls and (text.strip() or withdrawn or not turn.calls):
            turn.answer = text
            messages.append({"role": "assistant", "content": text})
            return turn
        if not calls or len(turn.calls) >= max_steps:
            # Past max_steps calls, or an empty answer after tool results
            # (small models stop there): the tools are withdrawn and the
            # model told to answer, once.
            turn.stopped = bool(calls)
            messages.append({"role": "user", "content": WITHDRAWN})
            withdrawn = True
            continue
        messages.append({"role": "assistant", "content": text or None,
                         "tool_calls": [c.to_openai() for c in calls]})
        for call in calls:
            key = call_key(call.name, _arguments(call))
            outcome = done[key] = repeated(done[key]) if key in done else \
                _run(call, routes.get(call.name), hub, watcher, approve_all)
            turn.calls.append((call.name, _arguments(call), outcome))
            messages.append({"role": "tool", "tool_call_id": call.id, "name": call.name,
                             "content": outcome.text})


def repeated(first: McpOutcome) -> McpOutcome:
    """A call made again with the same arguments: not run again (a tool may
    change something); the model is pointed at the result it has."""
    return McpOutcome("This exact call was already made; its result is above. "
                      f"It was: {first.text[:2000]}", is_error=first.is_error)


def _run(call: ToolCall, route: Route | None, hub: McpHub, watcher: Watcher,
         approve_all: bool) -> McpOutcome:
    arguments = _arguments(call)
    watcher.call(route, call.name, arguments)
    if route is None:
        outcome = McpOutcome(f"error: there is no tool named {call.name!r}", is_error=True)
    elif not (approve_all or route.tool.read_only or watcher.approve(route, arguments)):
        outcome = McpOutcome("error: the user declined to run this tool", is_error=True)
    else:
        try:
            outcome = hub.call(route.tool.server, route.tool.name, arguments)
        except LlmctlError as e:
            outcome = McpOutcome(f"error: {e}", is_error=True)
    watcher.result(route, outcome)
    return outcome
